"""The worker side: stash the window's queries, compact after the prefill, shift slots.

Installed on vLLM's CPU model runner and CPU attention backend by ``kvplugin.register``
(class-level wrappers, installed once per process):

* ``CPUAttentionBackendImpl.forward``: in a step where the scheduler ordered compactions,
  each attention layer copies the post-RoPE queries of the last ``window`` prompt tokens
  of those requests (``[window, q_heads, head_dim]`` per layer and request);
* ``CPUModelRunner.execute_model``: after the forward has written the prompt's keys and
  values, each ordered request is compacted in place (``kvplugin.compact``), its block
  table row is cut to the blocks it keeps (the scheduler freed the others), and its
  eviction count is recorded;
* the runner's ``compute_slot_mapping``: for compacted requests the cache slots and the
  sequence lengths use the compacted length (``position - evicted``) while the RoPE
  positions and token indices keep the original count: the moved keys already carry their
  rotation, only the new tokens' bookkeeping changes;
* ``CPUModelRunner.sample_tokens``: the step's output carries each compaction's time to
  the scheduler (``kvplugin.metrics.TIMINGS_ATTR``), which reports it with the request.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kvplugin.compact import compact_in_place, cpu_cache_views
from kvplugin.config import CompactionConfig, trace
from kvplugin.metrics import TIMINGS_ATTR
from kvplugin.scheduler import ORDERS_ATTR

log = logging.getLogger("vllm.gearshift.kv_compaction")


@dataclass
class _Step:
    """One execute_model call that carries compaction orders."""

    runner: Any
    orders: dict[str, int]
    window: int
    ranges: dict[str, tuple[int, int]] | None = None
    queries: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    scale: float | None = None


_STEP: _Step | None = None  # set only while such a step's forward runs


def _runner_state(runner: Any) -> dict[str, int]:
    """Request id -> tokens evicted, for the requests this runner has compacted."""
    evicted: dict[str, int] | None = getattr(runner, "_gearshift_kv_evicted", None)
    if evicted is None:
        evicted = {}
        runner._gearshift_kv_evicted = evicted
    return evicted


def attention_forward(original: Any) -> Any:
    def forward(self: Any, layer: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original(self, layer, query, *args, **kwargs)
        step, metadata = _STEP, args[3] if len(args) > 3 else kwargs.get("attn_metadata")
        if step is not None and metadata is not None:
            if step.ranges is None:
                ids = step.runner.input_batch.req_ids
                starts = metadata.query_start_loc.tolist()
                step.ranges = {
                    r: (starts[i], starts[i + 1]) for i, r in enumerate(ids) if r in step.orders
                }
            rows = query.view(query.shape[0], self.num_heads, self.head_size)
            for req_id, (start, end) in step.ranges.items():
                first = max(start, end - step.window)
                step.queries.setdefault(req_id, {})[layer.layer_name] = rows[first:end].clone()
            step.scale = self.scale
        return result

    forward._gearshift_kv = True  # type: ignore[attr-defined]
    return forward


def execute_model(original: Any, config: CompactionConfig) -> Any:
    def run(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        global _STEP
        evicted = _runner_state(self)
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
        for req_id in (*scheduler_output.finished_req_ids, *preempted):
            evicted.pop(req_id, None)
        _install_slot_shift(self)
        orders = getattr(scheduler_output, ORDERS_ATTR, None) or {}
        if not orders:
            return original(self, scheduler_output, *args, **kwargs)
        _STEP = _Step(self, dict(orders), config.window)
        try:
            result = original(self, scheduler_output, *args, **kwargs)
            step = _STEP
        finally:
            _STEP = None
        for req_id, keep in orders.items():
            _compact(self, step, req_id, keep, config)
        return result

    run._gearshift_kv = True  # type: ignore[attr-defined]
    return run


def sample_tokens(original: Any) -> Any:
    """Attach the compactions' times of the step to its output, for the scheduler (the
    output object itself under async scheduling is a wrapper of the one it reads)."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        timings = self.__dict__.get("_gearshift_kv_timings")
        if result is not None and timings:
            target = getattr(result, "_model_runner_output", result)
            setattr(target, TIMINGS_ATTR, dict(timings))
            timings.clear()
        return result

    run._gearshift_kv = True  # type: ignore[attr-defined]
    return run


def _layer_names(runner: Any) -> list[str]:
    names: list[str] = list(runner.kv_cache_config.kv_cache_groups[0].layer_names)
    return names


def _compact(runner: Any, step: _Step, req_id: str, keep: int, config: CompactionConfig) -> None:
    started = time.perf_counter()
    names = _layer_names(runner)
    stashed = step.queries.get(req_id, {})
    if req_id not in runner.requests or any(n not in stashed for n in names):
        # the scheduler has already freed the trailing blocks: this must not happen
        raise RuntimeError(f"KV compaction of {req_id}: the window's queries were not captured")
    state = runner.requests[req_id]
    seq_len = state.num_prompt_tokens
    context = runner.compilation_config.static_forward_context
    keys, values = zip(*(cpu_cache_views(context[n].kv_cache) for n in names), strict=True)
    block_size = keys[0].shape[2]
    blocks = state.block_ids[0]
    table = torch.tensor(blocks[: -(-seq_len // block_size)], dtype=torch.int32)
    queries = torch.stack([stashed[n] for n in names])
    result = compact_in_place(
        keys, table, seq_len, queries, keep, config, value_caches=values, scale=step.scale
    )
    kept_blocks = -(-result.new_length // block_size)
    del blocks[kept_blocks:]
    row = runner.input_batch.req_id_to_index[req_id]
    for group_table in runner.input_batch.block_table.block_tables[:1]:
        group_table.block_table.np[row, kept_blocks:] = 0
        group_table.num_blocks_per_row[row] = kept_blocks
    _runner_state(runner)[req_id] = seq_len - result.new_length
    seconds = time.perf_counter() - started
    runner.__dict__.setdefault("_gearshift_kv_timings", {})[req_id] = seconds
    log.info(
        "KV compaction: request %s compacted %d -> %d tokens in %.1f ms (%d moves)",
        req_id, seq_len, result.new_length, 1000 * seconds, result.plan.num_moves,
    )  # fmt: skip
    trace({
        "side": "worker", "request": req_id, "prompt_tokens": seq_len,
        "kept_tokens": result.new_length, "kept_positions": result.kept[:, 0].tolist(),
        "slot_positions": result.plan.positions[:, 0].tolist(), "kept_blocks": list(blocks),
    })  # fmt: skip


def _install_slot_shift(runner: Any) -> None:
    """Wrap this runner's (current) block table so compacted requests' slots shift."""
    tables = runner.input_batch.block_table
    if getattr(tables, "_gearshift_kv", False):
        return
    original = tables.compute_slot_mapping
    evicted = _runner_state(runner)

    def compute_slot_mapping(
        num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> None:
        ids = runner.input_batch.req_ids[:num_reqs] if evicted else []
        offsets = torch.tensor([evicted.get(r, 0) for r in ids], dtype=torch.int64)
        if not bool(offsets.any()):
            original(num_reqs, query_start_loc, positions)
            return
        counts = (query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]).to(torch.int64)
        shift = torch.repeat_interleave(offsets, counts)
        original(num_reqs, query_start_loc, positions - shift.to(positions.dtype))
        runner.seq_lens[:num_reqs] -= offsets.to(runner.seq_lens.dtype)
        runner.optimistic_seq_lens_cpu[:num_reqs] -= offsets.to(
            runner.optimistic_seq_lens_cpu.dtype
        )

    tables.compute_slot_mapping = compute_slot_mapping
    tables._gearshift_kv = True
