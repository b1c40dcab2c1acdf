"""The engine-core side: which requests are compacted, and the blocks they give back.

``--scheduler-cls kvplugin.scheduler.CompactingAsyncScheduler`` where vLLM schedules
asynchronously (its default; subclassing the synchronous ``Scheduler`` there would turn
async scheduling off, a ~78% latency regression measured in vLLM PR #43724), and
``kvplugin.scheduler.CompactingScheduler`` where async scheduling is off (e.g. ngram
speculation). ``backends.vllm_server`` picks the right one.

When a request's whole prompt is scheduled and it is longer than ``trigger_tokens``, the
scheduler (in the same ``schedule`` call) decides it keeps ``kept_tokens`` of them, takes
its blocks out of the prefix cache (a compacted block no longer holds what its hash
says), frees its trailing blocks, and tells the worker in the step's ``SchedulerOutput``.
Freeing them before the worker compacts is safe: the worker runs steps in order, so a
block handed to another request in a later step is written only after this step's
forward and compaction are done. From then on the request's block accounting runs on its
physical length (``num_computed_tokens - evicted``), and its blocks are never cached again.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from kvplugin.config import CompactionConfig, trace
from kvplugin.metrics import RESULT_KEY, TIMINGS_ATTR, CompactionRecord

log = logging.getLogger("vllm.gearshift.kv_compaction")

# The attribute of SchedulerOutput that carries {request id: tokens kept} to the worker.
ORDERS_ATTR = "gearshift_kv_compaction"


def _unsupported(vllm_config: Any) -> str | None:
    """Why this engine cannot compact (None when it can)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        # the worker hooks exist for the CPU model runner only; without them the freed
        # blocks would still be read
        return "the worker hooks cover vLLM's CPU model runner only"
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    model, cache = vllm_config.model_config, vllm_config.cache_config
    isa = _get_attn_isa(model.dtype, cache.block_size, model.get_head_size(), cache.cache_dtype)
    if isa != "vec":
        # kvplugin.compact.cpu_cache_views knows the block layout of the `vec` kernels only
        return f"the CPU attention kernels here ({isa}) use a cache layout the plugin does not read"
    spec = vllm_config.speculative_config
    if spec is not None and spec.method != "ngram":
        # a draft model's own cache layers would keep the blocks this frees
        return f"speculative decoding with {spec.method} (only ngram is supported)"
    return None


class _Shifted:
    """A request seen by its physical length: what the block accounting of a compacted
    request must use (everything else is read from the request itself)."""

    __slots__ = ("_evicted", "_request")

    def __init__(self, request: Request, evicted: int) -> None:
        self._request = request
        self._evicted = evicted

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)

    @property
    def num_computed_tokens(self) -> int:
        return int(self._request.num_computed_tokens) - self._evicted

    @property
    def num_tokens(self) -> int:
        return int(self._request.num_tokens) - self._evicted

    @property
    def num_prompt_tokens(self) -> int:
        return max(0, int(self._request.num_prompt_tokens) - self._evicted)


class _CompactionMixin:
    """Shared by both scheduler classes; see the module docstring."""

    requests: dict[str, Request]
    kv_cache_manager: Any
    vllm_config: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kv_compaction = CompactionConfig.from_env()
        self.kv_evicted: dict[str, int] = {}  # request id -> tokens evicted from its cache
        self.kv_totals = {"requests": 0, "evicted_tokens": 0, "freed_blocks": 0}
        # request id -> its compaction, until it finishes (then in its kv_transfer_params)
        self.kv_records: dict[str, CompactionRecord] = {}
        self._kv_compacted_once: set[str] = set()
        managers = self.kv_cache_manager.coordinator.single_type_managers
        if self.kv_compaction.enabled and len(managers) != 1:
            log.warning(
                "KV compaction is off: it handles one KV-cache group, this model has %d",
                len(managers),
            )
            self.kv_compaction = CompactionConfig()
        if self.kv_compaction.enabled and (reason := _unsupported(self.vllm_config)):
            log.warning("KV compaction is off: %s", reason)
            self.kv_compaction = CompactionConfig()
        manager = self.kv_cache_manager
        allocate, cache = manager.allocate_slots, manager.cache_blocks

        def allocate_slots(request: Request, *a: Any, **kw: Any) -> Any:
            evicted = self.kv_evicted.get(request.request_id)
            if evicted is None:
                return allocate(request, *a, **kw)
            # compacted blocks are never cached, hence delay_cache_blocks
            return allocate(_Shifted(request, evicted), *a, **{**kw, "delay_cache_blocks": True})

        def cache_blocks(request: Request, num_computed_tokens: int) -> None:
            if request.request_id not in self.kv_evicted:
                cache(request, num_computed_tokens)

        manager.allocate_slots = allocate_slots
        manager.cache_blocks = cache_blocks

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        orders: dict[str, int] = {}
        if self.kv_compaction.enabled:
            for req_id, scheduled in output.num_scheduled_tokens.items():
                keep = self._kv_keep(self.requests[req_id], scheduled)
                if keep is not None:
                    orders[req_id] = keep
            for req_id, keep in orders.items():
                self._kv_release(self.requests[req_id], keep)
        setattr(output, ORDERS_ATTR, orders)
        return output

    def _kv_keep(self, request: Request, scheduled: int) -> int | None:
        """Tokens ``request`` keeps if this step completes its prompt and it is compacted."""
        cfg, req_id = self.kv_compaction, request.request_id
        prompt = request.num_prompt_tokens
        if req_id in self._kv_compacted_once or request.num_tokens != prompt:
            return None  # once per request; a resumed (recomputed) request keeps its cache
        if not request.num_computed_tokens - scheduled < prompt <= request.num_computed_tokens:
            return None
        keep = cfg.kept_tokens(prompt)
        if keep >= prompt:
            return None
        if scheduled < cfg.window:
            log.info(
                "KV compaction skipped for %s: its last prefill chunk is shorter than the window",
                req_id,
            )
            return None
        blocks = self._kv_blocks(req_id)
        if any(b.ref_cnt > 1 for b in blocks):
            # shared through the prefix cache: in-place moves would corrupt the other
            # readers (gather_tokens into fresh blocks is the next step)
            log.info(
                "KV compaction skipped for %s: its blocks are shared through the prefix cache",
                req_id,
            )
            return None
        return keep

    def _kv_blocks(self, req_id: str) -> list[Any]:
        manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        blocks: list[Any] = manager.req_to_blocks[req_id]
        return blocks

    def _kv_release(self, request: Request, keep: int) -> None:
        req_id = request.request_id
        manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        pool = self.kv_cache_manager.block_pool
        blocks = self._kv_blocks(req_id)
        for block in blocks:
            pool._maybe_evict_cached_block(block)
        kept_blocks = -(-keep // manager.block_size)
        freed = blocks[kept_blocks:]
        del blocks[kept_blocks:]
        manager.num_cached_block[req_id] = 0
        pool.free_blocks(reversed(freed))
        evicted = request.num_prompt_tokens - keep
        self.kv_evicted[req_id] = evicted
        self._kv_compacted_once.add(req_id)
        self.kv_records[req_id] = CompactionRecord(request.num_prompt_tokens, keep, len(freed))
        totals = self.kv_totals
        totals["requests"] += 1
        totals["evicted_tokens"] += evicted
        totals["freed_blocks"] += len(freed)
        log.info(
            "KV compaction: request %s keeps %d of %d prompt tokens (evicted %d, freed %d blocks); "
            "totals: %d requests, %d tokens evicted, %d blocks freed",
            req_id, keep, request.num_prompt_tokens, evicted, len(freed),
            totals["requests"], totals["evicted_tokens"], totals["freed_blocks"],
        )  # fmt: skip
        trace({
            "side": "scheduler", "request": req_id, "prompt_tokens": request.num_prompt_tokens,
            "kept_tokens": keep, "kept_blocks": [b.block_id for b in blocks],
            "freed_blocks": [b.block_id for b in freed],
        })  # fmt: skip

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        # the worker's time for the compactions it did in that step (kvplugin.worker)
        timings = getattr(model_runner_output, TIMINGS_ATTR, None) or {}
        for req_id, seconds in timings.items():
            if (record := self.kv_records.get(req_id)) is not None:
                record.seconds += seconds
        return super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # recomputed from its tokens with a full cache: its blocks are all freed here
        super()._preempt_request(request, *args, **kwargs)  # type: ignore[misc]
        if self.kv_evicted.pop(request.request_id, None) is not None:
            self.kv_records[request.request_id].recomputed = True
            log.info(
                "KV compaction: compacted request %s preempted; it recomputes with a full cache",
                request.request_id,
            )

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """vLLM's, with the request's compaction record added to its kv_transfer_params
        (what reaches the API server's answer and kvplugin.metrics' counters)."""
        self.kv_evicted.pop(request.request_id, None)
        self._kv_compacted_once.discard(request.request_id)
        record = self.kv_records.pop(request.request_id, None)
        kv_params, *rest = super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        if record is not None:
            kv_params = {**(kv_params or {}), RESULT_KEY: record.to_json()}
        return (kv_params, *rest)


class CompactingScheduler(_CompactionMixin, Scheduler):  # type: ignore[misc]
    """For engines whose async scheduling is off (ngram speculation, pipeline parallel)."""


class CompactingAsyncScheduler(_CompactionMixin, AsyncScheduler):  # type: ignore[misc]
    """For engines that schedule asynchronously (vLLM's default)."""
