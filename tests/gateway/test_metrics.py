"""The metrics' kept children: the same child for the same label values, whatever the
spelling of the call, and the exposition prometheus_client would write."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PlainCounter

from gateway.metrics import Metrics
from router import Tier


def test_a_child_is_kept_per_label_values_and_counts_as_prometheus_clients_would() -> None:
    m = Metrics()
    child = m.requests.labels("chat", Tier.FAST, "200")
    assert m.requests.labels("chat", Tier.FAST, "200") is child
    child.inc()
    m.requests.labels("chat", "fast", "200").inc()  # the enum's value: the same series
    m.requests.labels(endpoint="chat", tier="fast", status="200").inc()
    m.requests.labels("chat", "full", "502").inc(2)
    plain = PlainCounter(
        "gearshift_requests", "Requests by endpoint, serving tier and HTTP status",
        ["endpoint", "tier", "status"], registry=(r := CollectorRegistry()),
    )  # fmt: skip
    plain.labels("chat", "fast", "200").inc(3)
    plain.labels("chat", "full", "502").inc(2)
    assert series(m.registry, b"gearshift_requests") == series(r, b"gearshift_requests")


def series(registry: CollectorRegistry, name: bytes) -> list[bytes]:
    """The exposition's lines for ``name``, but its creation times."""
    lines = generate_latest(registry).splitlines()
    return [x for x in lines if name in x and b"_created" not in x]


def test_a_histograms_children_are_kept_and_observe_into_their_own_series() -> None:
    m = Metrics()
    m.latency.labels("chat", "fast", "false").observe(0.02)
    m.latency.labels("chat", "fast", "false").observe(0.2)
    m.latency.labels("chat", "full", "true").observe(1.0)
    assert m.latency.labels("chat", "fast", "false") is m.latency.labels("chat", "fast", "false")
    counts = series(m.registry, b"gearshift_request_duration_seconds_count")
    assert counts == [
        b'gearshift_request_duration_seconds_count{endpoint="chat",stream="false",tier="fast"} 2.0',
        b'gearshift_request_duration_seconds_count{endpoint="chat",stream="true",tier="full"} 1.0',
    ]
