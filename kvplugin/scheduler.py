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
A request whose blocks are shared through the prefix cache (``ref_cnt > 1``) gets fresh
blocks instead, which the worker gathers the kept tokens into; its old blocks are all
released, unchanged (the shared ones stay with their other readers and in the cache).
Freeing them before the worker compacts is safe: the worker runs steps in order, so a
block handed to another request in a later step is written only after this step's
forward and compaction are done. From then on the request's block accounting runs on its
physical length (``num_computed_tokens - evicted``), and its blocks are never cached again.

With ``trigger: watermark`` the step that completes such a prompt only has the worker keep
its window's queries; later, in any step that leaves the pool's usage at ``high_watermark``
or above, the scheduler compacts the running requests of that step that have them, longest
first, until the usage is under ``low_watermark``. Such a request keeps ``kept_tokens`` of
its prompt and every token decoded since (``CompactionRecord.cached_tokens`` says how many
tokens its cache held then). One preempted before that keeps its queries, and can be
compacted once it runs again on its recomputed cache.
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

# The attributes of SchedulerOutput that tell the worker, for this step, which requests to
# compact after the forward ({request id: Order}, below) and whose
# window queries to keep from the forward (the requests whose prompt it completes that will
# be compacted, now or, with the watermark trigger, in a later step).
ORDERS_ATTR = "gearshift_kv_compaction"
STASH_ATTR = "gearshift_kv_stash"
# One compaction order: (prompt tokens kept, tokens cached after the step's forward, the fresh
# blocks to gather the kept tokens into, or None to compact in place). The worker applies a
# step's orders in the order the scheduler made them: a request whose shared blocks another
# one gathers from is compacted in place only after that gather (its blocks became its own
# when the other released them).
Order = tuple[int, int, list[int] | None]


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
        # requests whose window queries the worker keeps (watermark trigger), not compacted yet
        self._kv_stashed: set[str] = set()
        self._kv_skip_logged: set[str] = set()  # said once per request, not at every step
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
        orders: dict[str, Order] = {}
        stash: list[str] = []
        cfg = self.kv_compaction
        if cfg.enabled:
            for req_id, scheduled in output.num_scheduled_tokens.items():
                request = self.requests[req_id]
                keep = self._kv_keep(request, scheduled)
                if keep is None:
                    continue
                stash.append(req_id)  # the worker captures its window's queries
                if cfg.trigger == "watermark":
                    self._kv_stashed.add(req_id)  # for a compaction later
                elif order := self._kv_compact(request, keep, request.num_prompt_tokens):
                    orders[req_id] = order
            if cfg.trigger == "watermark":
                orders = self._kv_watermark(output)
        setattr(output, ORDERS_ATTR, orders)
        setattr(output, STASH_ATTR, stash)
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
        return keep

    def _kv_watermark(self, output: SchedulerOutput) -> dict[str, Order]:
        """With the KV pool's usage at the high watermark or above, compact the running
        requests of this step whose window queries the worker keeps, longest first, until
        the usage is under the low watermark. Returns their orders."""
        cfg, pool = self.kv_compaction, self.kv_cache_manager.block_pool
        orders: dict[str, Order] = {}
        candidates = [
            self.requests[r]
            for r in output.num_scheduled_tokens
            # speculated tokens may be rejected: their slots must stay at the sequence's end
            if r in self._kv_stashed and r not in output.scheduled_spec_decode_tokens
        ]
        usage = pool.get_usage()
        if not candidates or usage < cfg.high_watermark:
            return orders
        candidates.sort(key=lambda r: r.num_computed_tokens, reverse=True)
        for request in candidates:
            if pool.get_usage() < cfg.low_watermark:
                break
            keep = cfg.kept_tokens(request.num_prompt_tokens)
            # after this step's forward the cache holds every computed token
            if order := self._kv_compact(request, keep, request.num_computed_tokens):
                orders[request.request_id] = order
        if orders:
            log.info(
                "KV compaction: the KV cache was %.0f%% used (high watermark %.0f%%); %d of %d "
                "running requests compacted, now %.0f%% (low watermark %.0f%%)",
                100 * usage, 100 * cfg.high_watermark, len(orders), len(candidates),
                100 * pool.get_usage(), 100 * cfg.low_watermark,
            )  # fmt: skip
        return orders

    def _kv_blocks(self, req_id: str) -> list[Any]:
        manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        blocks: list[Any] = manager.req_to_blocks[req_id]
        return blocks

    def _kv_compact(self, request: Request, keep: int, length: int) -> Order | None:
        """``request`` keeps ``keep`` of its prompt tokens, and every token after them, of
        the ``length`` its cache holds after this step: the blocks it no longer needs go
        back now. Its order for the worker, or None when it cannot be compacted now.

        Blocks shared through the prefix cache must not be written (their other readers
        still need them): the kept tokens are then gathered into fresh blocks and every old
        one is released (the shared ones stay with their readers, and in the prefix cache).
        Otherwise the request is compacted in place, its blocks leave the prefix cache (they
        will no longer hold what their hash says) and its trailing blocks are freed."""
        req_id = request.request_id
        manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        pool = self.kv_cache_manager.block_pool
        blocks = self._kv_blocks(req_id)
        held, evicted = len(blocks), request.num_prompt_tokens - keep
        needed = -(-(length - evicted) // manager.block_size)
        fresh: list[int] | None = None
        if any(b.ref_cnt > 1 for b in blocks):
            if pool.get_num_free_blocks() < needed:
                if req_id not in self._kv_skip_logged:
                    self._kv_skip_logged.add(req_id)
                    log.info(
                        "KV compaction skipped for %s: its blocks are shared through the prefix "
                        "cache and fewer than %d blocks are free to gather into", req_id, needed,
                    )  # fmt: skip
                return None
            released = list(blocks)
            blocks[:] = pool.get_new_blocks(needed)
            fresh = [b.block_id for b in blocks]
        else:
            for block in blocks:
                pool._maybe_evict_cached_block(block)
            released = blocks[needed:]
            del blocks[needed:]
        manager.num_cached_block[req_id] = 0
        pool.free_blocks(reversed(released))
        self.kv_evicted[req_id] = evicted
        self._kv_compacted_once.add(req_id)
        self._kv_stashed.discard(req_id)
        self.kv_records[req_id] = CompactionRecord(
            request.num_prompt_tokens, keep, held - needed, cached_tokens=length
        )
        self._kv_count(req_id, request.num_prompt_tokens, keep, held - needed)
        trace({
            "side": "scheduler", "request": req_id, "prompt_tokens": request.num_prompt_tokens,
            "kept_tokens": keep, "cached_tokens": length, "gathered": fresh is not None,
            "held_blocks": held, "kept_blocks": [b.block_id for b in blocks],
            "released_blocks": [b.block_id for b in released], "usage_after": pool.get_usage(),
        })  # fmt: skip
        return keep, length, fresh

    def _kv_count(self, req_id: str, prompt: int, keep: int, freed: int) -> None:
        totals = self.kv_totals
        totals["requests"] += 1
        totals["evicted_tokens"] += prompt - keep
        totals["freed_blocks"] += freed
        log.info(
            "KV compaction: request %s keeps %d of %d prompt tokens (evicted %d, freed %d blocks); "
            "totals: %d requests, %d tokens evicted, %d blocks freed",
            req_id, keep, prompt, prompt - keep, freed,
            totals["requests"], totals["evicted_tokens"], totals["freed_blocks"],
        )  # fmt: skip

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
        req_id = request.request_id
        if self.kv_evicted.pop(req_id, None) is not None:
            self.kv_records[req_id].recomputed = True
            log.info(
                "KV compaction: compacted request %s preempted; it recomputes with a full cache",
                req_id,
            )
        elif req_id in self._kv_stashed:
            # its window's queries stay valid (the recomputed cache holds the same keys at
            # the same positions): the worker keeps them and the watermark may compact it
            # once it runs again
            log.info(
                "KV compaction: preempted request %s was not compacted yet; it can be "
                "compacted when it resumes", req_id,
            )  # fmt: skip

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """vLLM's, with the request's compaction record added to its kv_transfer_params
        (what reaches the API server's answer and kvplugin.metrics' counters)."""
        self.kv_evicted.pop(request.request_id, None)
        self._kv_compacted_once.discard(request.request_id)
        self._kv_stashed.discard(request.request_id)
        self._kv_skip_logged.discard(request.request_id)
        record = self.kv_records.pop(request.request_id, None)
        kv_params, *rest = super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        if record is not None:
            kv_params = {**(kv_params or {}), RESULT_KEY: record.to_json()}
        return (kv_params, *rest)


class CompactingScheduler(_CompactionMixin, Scheduler):  # type: ignore[misc]
    """For engines whose async scheduling is off (ngram speculation, pipeline parallel)."""


class CompactingAsyncScheduler(_CompactionMixin, AsyncScheduler):  # type: ignore[misc]
    """For engines that schedule asynchronously (vLLM's default)."""
