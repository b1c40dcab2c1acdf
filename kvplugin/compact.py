"""Compact one request's cache in place: score, select, fill holes from the tail.

No vLLM here, only torch and ``kernels``, so a pure-torch test can drive the very function
the worker calls. vLLM's CPU attention backend keeps each layer's cache as
``[num_blocks, kv_heads, block_size, 2 * head_dim]``; ``cpu_cache_views`` views its keys
and its values, without copying, in the kernels' FLASH layout with the strides that say
where each element really is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import KVLayout, MovePlan, apply_moves, plan_in_place, score_tokens, select_tokens
from kernels.compaction import Backend
from kvplugin.config import CompactionConfig


def cpu_cache_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of vLLM's CPU cache as two FLASH-layout views: its keys and its values.

    The CPU backend (``vec`` ISA) stores, per block and KV head, the keys transposed
    (``[head_dim, block_size]``) and then the values (``[block_size, head_dim]``), in a
    ``[blocks, heads, block_size, 2 * head_dim]`` tensor. The kernels' FLASH layout is
    ``[2, blocks, block_size, heads, dim]`` with any strides, so each half becomes such a
    view whose key/value dimension has stride 0 (both entries are the same half): a
    copy through it moves that half (twice, harmlessly), and scoring reads its keys.
    """
    blocks, heads, block_size, twice = cache.shape
    dim = twice // 2
    s_block, s_head = cache.stride(0), cache.stride(1)
    size = (2, blocks, block_size, heads, dim)
    keys = cache.as_strided(size, (0, s_block, 1, s_head, block_size), cache.storage_offset())
    values = cache.as_strided(
        size, (0, s_block, dim, s_head, 1), cache.storage_offset() + block_size * dim
    )
    return keys, values


def default_backend(device: torch.device) -> Backend:
    """The torch path on CPU, the Triton kernels on CUDA: never a silent fallback."""
    if device.type == "cpu":
        return "torch"
    if device.type == "cuda":
        return "triton"
    raise ValueError(f"KV compaction has no backend for {device.type} caches")


@dataclass(frozen=True, slots=True)
class Compaction:
    new_length: int
    kept: torch.Tensor  # [layers, 1 or kv_heads, new_length] original positions, sorted
    plan: MovePlan

    @property
    def freed_blocks(self) -> list[int]:
        return [int(b) for b in self.plan.freed_blocks]


def compact_in_place(
    key_caches: Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
    keep: int,
    config: CompactionConfig,
    *,
    value_caches: Sequence[torch.Tensor] | None = None,
    scale: float | None = None,
    backend: Backend | None = None,
) -> Compaction:
    """Keep ``keep`` of the ``seq_len`` tokens of one sequence, in place.

    ``key_caches``: every layer's cache in the FLASH layout, whose key half is scored and
    which is moved; ``value_caches``: separate views moved the same way, when keys and
    values live in different views (``cpu_cache_views``). ``block_table``: the sequence's
    blocks; ``queries``: ``[layers, window, q_heads, dim]``, the post-RoPE queries of its
    last ``window`` tokens. After it, the first ``keep`` slots of the sequence hold the
    kept tokens (not in order: ``plan.positions`` says where each came from) and
    ``plan.freed_blocks`` hold nothing the sequence needs.
    """
    backend = backend or default_backend(key_caches[0].device)
    block_size = key_caches[0].shape[2]
    scores = score_tokens(
        key_caches, KVLayout.FLASH, block_table, seq_len, queries, backend, scale=scale
    )
    kept = select_tokens(
        scores, keep, sinks=config.sinks, window=min(config.window, keep), per_head=config.per_head
    )
    mask = torch.zeros(kept.shape[0], kept.shape[1], seq_len, dtype=torch.bool, device=kept.device)
    mask.scatter_(-1, kept, True)
    plan = plan_in_place(mask, block_table, block_size)
    apply_moves(key_caches, KVLayout.FLASH, block_table, plan, backend)
    if value_caches is not None:
        apply_moves(value_caches, KVLayout.FLASH, block_table, plan, backend)
    return Compaction(plan.new_length, kept, plan)
