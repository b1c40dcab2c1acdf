"""The worker side: stash the window's queries, compact after the prefill, shift slots.

Installed on vLLM's CPU model runner and CPU attention backend by ``kvplugin.register``
(class-level wrappers, installed once per process):

* ``CPUAttentionBackendImpl.forward``: in a step where the scheduler asks for them
  (``STASH_ATTR``: requests whose prompt the step completes), each attention layer copies
  the post-RoPE queries of the last ``window`` prompt tokens of those requests
  (``[window, q_heads, head_dim]`` per layer and request); the runner keeps them until the
  request is compacted (in the same step for the prompt trigger, in a later one for the
  watermark trigger, maybe after a preemption) or finishes;
* ``CPUModelRunner.execute_model``: after the forward has written the step's keys and
  values, each ordered request is compacted (``kvplugin.compact``: the prompt is scored
  and selected, tokens decoded after it are kept) in place, or gathered into the fresh
  blocks the scheduler gave it when its own are shared; its block table row becomes the
  blocks it keeps (the scheduler freed the others), and its eviction count is recorded;
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

from kvplugin.compact import compact_in_place, compact_into, cpu_cache_views
from kvplugin.config import CompactionConfig, trace
from kvplugin.metrics import TIMINGS_ATTR
from kvplugin.scheduler import ORDERS_ATTR, STASH_ATTR, Order

log = logging.getLogger("vllm.gearshift.kv_compaction")


@dataclass
class _Step:
    """One execute_model call whose forward captures window queries."""

    runner: Any
    capture: set[str]
    window: int
    ranges: dict[str, tuple[int, int]] | None = None
    queries: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


_STEP: _Step | None = None  # set only while such a step's forward runs


def _runner_state(runner: Any) -> dict[str, int]:
    """Request id -> tokens evicted, for the requests this runner has compacted."""
    evicted: dict[str, int] = runner.__dict__.setdefault("_gearshift_kv_evicted", {})
    return evicted


def _stashed(runner: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Request id -> layer -> window queries, for the requests this runner will compact."""
    stash: dict[str, dict[str, torch.Tensor]] = runner.__dict__.setdefault(
        "_gearshift_kv_stash", {}
    )
    return stash


def attention_forward(original: Any) -> Any:
    def forward(self: Any, layer: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original(self, layer, query, *args, **kwargs)
        step, metadata = _STEP, args[3] if len(args) > 3 else kwargs.get("attn_metadata")
        if step is not None and metadata is not None:
            if step.ranges is None:
                ids = step.runner.input_batch.req_ids
                starts = metadata.query_start_loc.tolist()
                step.ranges = {
                    r: (starts[i], starts[i + 1]) for i, r in enumerate(ids) if r in step.capture
                }
            rows = query.view(query.shape[0], self.num_heads, self.head_size)
            for req_id, (start, end) in step.ranges.items():
                first = max(start, end - step.window)
                step.queries.setdefault(req_id, {})[layer.layer_name] = rows[first:end].clone()
            step.runner._gearshift_kv_scale = self.scale
        return result

    forward._gearshift_kv = True  # type: ignore[attr-defined]
    return forward


def execute_model(original: Any, config: CompactionConfig) -> Any:
    def run(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        global _STEP
        evicted, stash = _runner_state(self), _stashed(self)
        for req_id in scheduler_output.finished_req_ids:
            evicted.pop(req_id, None)
            stash.pop(req_id, None)
        # a preempted request is recomputed whole: its keys come back at the same positions,
        # so window queries kept for a compaction it has not had yet stay valid
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            evicted.pop(req_id, None)
        _install_slot_shift(self)
        orders = getattr(scheduler_output, ORDERS_ATTR, None) or {}
        capture = set(getattr(scheduler_output, STASH_ATTR, None) or ())
        if not capture:
            result = original(self, scheduler_output, *args, **kwargs)
        else:
            _STEP = step = _Step(self, capture, config.window)
            try:
                result = original(self, scheduler_output, *args, **kwargs)
            finally:
                _STEP = None
            stash.update(step.queries)
        for req_id, order in orders.items():  # in the scheduler's order (see Order)
            _compact(self, req_id, order, config)
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


def _compact(runner: Any, req_id: str, order: Order, config: CompactionConfig) -> None:
    """Compact ``req_id``'s cache as ``order`` says (``kvplugin.scheduler.Order``): to its
    kept prompt tokens and the tokens decoded after the prompt, in place or gathered into
    the fresh blocks the scheduler gave it."""
    started = time.perf_counter()
    keep, length, fresh = order
    names = _layer_names(runner)
    stashed = _stashed(runner).pop(req_id, {})
    if req_id not in runner.requests or any(n not in stashed for n in names):
        # the scheduler has already freed the trailing blocks: this must not happen
        raise RuntimeError(f"KV compaction of {req_id}: the window's queries were not captured")
    state = runner.requests[req_id]
    seq_len = state.num_prompt_tokens
    context = runner.compilation_config.static_forward_context
    keys, values = zip(*(cpu_cache_views(context[n].kv_cache) for n in names), strict=True)
    block_size = keys[0].shape[2]
    blocks = state.block_ids[0]
    table = torch.tensor(blocks[: -(-length // block_size)], dtype=torch.int32)
    queries = torch.stack([stashed[n] for n in names])
    scale = runner.__dict__.get("_gearshift_kv_scale")
    if fresh is None:
        result = compact_in_place(
            keys, table, seq_len, queries, keep, config, value_caches=values, scale=scale,
            length=length,
        )  # fmt: skip
        del blocks[-(-result.new_length // block_size) :]
    else:
        result = compact_into(
            keys, table, seq_len, queries, keep, config, torch.tensor(fresh, dtype=torch.int32),
            value_caches=values, scale=scale, length=length,
        )  # fmt: skip
        blocks[:] = fresh
    row = runner.input_batch.req_id_to_index[req_id]
    for group_table in runner.input_batch.block_table.block_tables[:1]:
        group_table.block_table.np[row, : len(blocks)] = blocks
        group_table.block_table.np[row, len(blocks) :] = 0
        group_table.num_blocks_per_row[row] = len(blocks)
    _runner_state(runner)[req_id] = length - result.new_length
    seconds = time.perf_counter() - started
    runner.__dict__.setdefault("_gearshift_kv_timings", {})[req_id] = seconds
    log.info(
        "KV compaction: request %s compacted %d -> %d tokens in %.1f ms (%d %s)",
        req_id, length, result.new_length, 1000 * seconds, result.moves,
        "moves" if fresh is None else "tokens gathered into fresh blocks",
    )  # fmt: skip
    trace({
        "side": "worker", "request": req_id, "prompt_tokens": seq_len, "cached_tokens": length,
        "kept_tokens": result.new_length - (length - seq_len),
        "kept_positions": result.kept[:, 0].tolist(),
        "slot_positions": result.positions[:, 0].tolist(), "kept_blocks": list(blocks),
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
