"""What a compaction leaves visible: a per-request record and Prometheus counters.

The engine core (``kvplugin.scheduler``) keeps, per compacted request, how many prompt
tokens it kept and evicted, the blocks it freed and the worker's time; when the request
finishes, the record leaves the engine in the request's ``kv_transfer_params`` (vLLM's
field for what the KV side says about a finished request) under ``RESULT_KEY``. vLLM's
OpenAI server puts that field in non-streamed answers, which is how Gearshift's gateway
learns that a step's context was compacted.

In the API-server process the plugin counts those records into four counters of the
process's Prometheus registry, the one vLLM's ``/metrics`` serves (no ``vllm:`` prefix:
vLLM unregisters its own prefix's collectors when its stat logger starts). A request is
counted when it finishes; one aborted before its end is not.

Pure Python apart from ``prometheus_client`` (imported when the counters are made), so the
gateway reads ``RESULT_KEY`` and ``COUNTERS`` from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# the key of kv_transfer_params that carries a finished request's record
RESULT_KEY = "gearshift_kv_compaction"
# the attribute of a ModelRunnerOutput that carries {request id: seconds} to the scheduler
TIMINGS_ATTR = "gearshift_kv_compaction_seconds"

# Prometheus counter name (without _total) -> the record's field it sums (None: one a request)
COUNTERS: dict[str, str | None] = {
    "gearshift_kv_compactions": None,
    "gearshift_kv_compaction_evicted_tokens": "evicted_tokens",
    "gearshift_kv_compaction_freed_blocks": "freed_blocks",
    "gearshift_kv_compaction_seconds": "seconds",
}
_HELP = {
    "gearshift_kv_compactions": "Requests whose KV cache was compacted (counted when they finish)",
    "gearshift_kv_compaction_evicted_tokens": "Prompt tokens evicted from KV caches",
    "gearshift_kv_compaction_freed_blocks": "KV blocks freed by compaction",
    "gearshift_kv_compaction_seconds": "Time the workers spent compacting (scoring and moves)",
}


@dataclass(slots=True)
class CompactionRecord:
    """One request's compaction, as the scheduler saw it and the worker timed it."""

    prompt_tokens: int
    kept_tokens: int
    freed_blocks: int
    # tokens in the cache when it was compacted: prompt_tokens for the prompt trigger, more
    # for the watermark one (the tokens decoded before it saw the full cache)
    cached_tokens: int = 0
    seconds: float = 0.0
    # preempted after compaction: recomputed with a full cache from then on
    recomputed: bool = False

    @property
    def evicted_tokens(self) -> int:
        return self.prompt_tokens - self.kept_tokens

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "evicted_tokens": self.evicted_tokens}


def record_of(kv_transfer_params: object) -> dict[str, Any] | None:
    """The compaction record in a finished request's ``kv_transfer_params``, if any."""
    if not isinstance(kv_transfer_params, Mapping):
        return None
    record = kv_transfer_params.get(RESULT_KEY)
    return dict(record) if isinstance(record, Mapping) else None


class _Counters:
    def __init__(self) -> None:
        from prometheus_client import Counter

        self.counters = {name: Counter(name, _HELP[name]) for name in COUNTERS}

    def count(self, record: Mapping[str, Any]) -> None:
        for name, field_name in COUNTERS.items():
            value = 1.0 if field_name is None else float(record.get(field_name) or 0.0)
            self.counters[name].inc(value)


_COUNTERS: _Counters | None = None


def counters() -> _Counters:
    """This process's counters, made (and registered) once."""
    global _COUNTERS
    if _COUNTERS is None:
        _COUNTERS = _Counters()
    return _COUNTERS


def install_frontend_hook() -> None:
    """Count every finished request's record as vLLM's output processor sees it (in the
    process that serves ``/metrics``; harmless in the others, which see no outputs)."""
    from vllm.v1.engine.output_processor import OutputProcessor

    if getattr(OutputProcessor.process_outputs, "_gearshift_kv", False):
        return
    original = OutputProcessor.process_outputs
    counters()

    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        for output in engine_core_outputs:
            record = record_of(getattr(output, "kv_transfer_params", None))
            if record is not None:
                counters().count(record)
        return original(self, engine_core_outputs, *args, **kwargs)

    process_outputs._gearshift_kv = True  # type: ignore[attr-defined]
    OutputProcessor.process_outputs = process_outputs
