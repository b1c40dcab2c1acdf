"""Prometheus metrics, in a registry owned by one app (no module-level collectors)."""

from __future__ import annotations

from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class _KeptChildren:
    """``labels(*values)`` with each child kept by its values as given: prometheus_client's
    own lookup (``str`` of every value, a lock, a dict) costs ~2 µs, and a request makes
    several. Only for metrics whose children are never removed (no ``remove``/``clear``
    here); a keyword call goes to prometheus_client as it is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept: dict[tuple[Any, ...], Any] = {}

    def labels(self, *values: Any, **named: Any) -> Any:
        if named:
            return super().labels(*values, **named)  # type: ignore[misc]
        child = self._kept.get(values)
        if child is None:
            child = self._kept[values] = super().labels(*values)  # type: ignore[misc]
        return child


class Counter(_KeptChildren, prometheus_client.Counter):
    pass


class Histogram(_KeptChildren, prometheus_client.Histogram):
    pass


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gearshift_requests",
            "Requests by endpoint, serving tier and HTTP status",
            ["endpoint", "tier", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "gearshift_request_duration_seconds",
            "Time from request to last byte",
            ["endpoint", "tier", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gearshift_time_to_first_token_seconds",
            "Time to the first streamed event",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "gearshift_overhead_seconds",
            "Time spent in the gateway itself (excludes waiting on replicas)",
            ["endpoint", "stream"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "gearshift_tokens",
            "Tokens by tier and kind (prompt, completion)",
            ["tier", "kind"],
            registry=r,
        )
        self.routes = Counter(
            "gearshift_route_decisions",
            "Routing decisions by chosen tier and policy",
            ["tier", "policy"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "gearshift_upstream_errors",
            "Failed upstream attempts by tier and kind",
            ["tier", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "gearshift_retries",
            "Retried upstream attempts by tier and cause",
            ["tier", "cause"],
            registry=r,
        )
        self.fallbacks = Counter(
            "gearshift_fallbacks",
            "Requests moved to the other tier because theirs was down",
            ["from_tier", "to_tier"],
            registry=r,
        )
        self.stream_errors = Counter(
            "gearshift_stream_errors",
            "Streams ended by an error event after the first byte",
            ["tier", "kind"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "gearshift_client_disconnects",
            "Requests whose client went away; upstream work cancelled",
            ["tier"],
            registry=r,
        )
        self.spec_drafts = Gauge(
            "gearshift_spec_decode_drafts", "Speculative-decoding drafts proposed by the tier's engines (cumulative)",
            ["tier"], registry=r,
        )  # fmt: skip
        self.spec_draft_tokens = Gauge(
            "gearshift_spec_decode_draft_tokens", "Draft tokens proposed by the tier's engines (cumulative)",
            ["tier"], registry=r,
        )  # fmt: skip
        self.spec_accepted_tokens = Gauge(
            "gearshift_spec_decode_accepted_tokens", "Draft tokens accepted by the tier's engines (cumulative)",
            ["tier"], registry=r,
        )  # fmt: skip
        self.spec_acceptance_rate = Gauge(
            "gearshift_spec_decode_acceptance_rate", "Accepted / drafted tokens since the previous scrape",
            ["tier"], registry=r,
        )  # fmt: skip
        self.kv_compaction = Gauge(
            "gearshift_tier_kv_compaction", "KV-cache compaction in the tier's engines (cumulative): "
            "compactions, evicted_tokens, freed_blocks, seconds", ["tier", "figure"], registry=r,
        )  # fmt: skip
        self.replica_queue = Gauge(
            "gearshift_replica_requests", "Requests running or waiting in a replica's engine",
            ["tier", "replica", "state"], registry=r,
        )  # fmt: skip
        self.replica_healthy = Gauge(
            "gearshift_replica_healthy",
            "1 when a replica passes its health checks",
            ["tier", "replica"],
            registry=r,
        )
        self.route_decision = Histogram(
            "gearshift_route_decision_seconds", "Time the routing policy took to decide",
            buckets=(2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2), registry=r,
        )  # fmt: skip
        self.prompt_token_error = Histogram(
            "gearshift_route_prompt_tokens_error",
            "Relative error of the router's prompt-token estimate against the tier's count",
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=r,
        )  # fmt: skip
        self.prompt_token_anchored_error = Histogram(
            "gearshift_route_prompt_tokens_anchored_error",
            "Relative error of the prompt tokens the router used for a session's step sized "
            "from its previous step's exact count, against the tier's count",
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=r,
        )  # fmt: skip
        self.escalations = Counter(
            "gearshift_escalations",
            "Fast-tier answers re-run on the full tier before reaching the client",
            ["reason"],
            registry=r,
        )
        self.recorder_queued = Gauge(
            "gearshift_recorder_queue", "Steps waiting to be written to the store", registry=r
        )
        self.recorder_queued_bytes = Gauge(
            "gearshift_recorder_queue_bytes",
            "Bytes of encoded steps waiting to be written (bounded by store.queue_mb)",
            registry=r,
        )
        self.recorder_written = Counter(
            "gearshift_recorder_written", "Steps committed to the store", registry=r
        )
        self.recorder_dropped = Counter(
            "gearshift_recorder_dropped",
            "Steps not recorded: queue_full, closing, write_failed (kept in the dead-letter file)",
            ["reason"],
            registry=r,
        )
        self.recorder_retries = Counter(
            "gearshift_recorder_retries", "Store writes retried after a lost connection", registry=r
        )
        self.recorder_writer_starved = Counter(
            "gearshift_recorder_writer_starved",
            "Writers brought back to store.writer_nice after starving at idle priority "
            "(store.writer_idle: the writer's core was kept busy, by this gateway or other work)",
            registry=r,
        )
        self.recorder_batch = Histogram(
            "gearshift_recorder_batch_steps", "Steps per committed batch",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r,
        )  # fmt: skip
        self.recorder_commit = Histogram(
            "gearshift_recorder_commit_seconds", "Time to write and commit one batch", registry=r
        )
        self.admission_refused = Counter(
            "gearshift_admission_refused",
            "Requests refused by a rate limit or budget (scope: tenant|key; limit: "
            "requests/minute, tokens/minute|day|month)",
            ["tenant", "scope", "limit"],
            registry=r,
        )
        self.budget_soft = Counter(
            "gearshift_budget_soft_exceeded",
            "Admitted requests that took a token budget past its soft threshold",
            ["tenant", "scope", "period"],
            registry=r,
        )
