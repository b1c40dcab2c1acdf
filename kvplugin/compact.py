"""Compact one request's cache: score, select, then fill holes from the tail in place, or
gather the kept tokens into fresh blocks when the old ones are shared.

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

from kernels import (
    KVLayout,
    apply_moves,
    gather_tokens,
    plan_in_place,
    score_tokens,
    select_tokens,
)
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
    kept: torch.Tensor  # [layers, 1 or kv_heads, keep] original positions scored, sorted
    positions: torch.Tensor  # [layers, 1 or kv_heads, new_length] where each slot's token was
    moves: int  # tokens copied per (layer, head)
    freed_blocks: list[int]  # blocks of the old table that hold nothing the sequence needs


def _selection(
    key_caches: Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
    keep: int,
    config: CompactionConfig,
    scale: float | None,
    backend: Backend,
) -> torch.Tensor:
    """The ``keep`` positions of the first ``seq_len`` that survive, ``[layers, 1 or heads,
    keep]``, sorted."""
    scores = score_tokens(
        key_caches, KVLayout.FLASH, block_table, seq_len, queries, backend, scale=scale
    )
    return select_tokens(
        scores, keep, sinks=config.sinks, window=min(config.window, keep), per_head=config.per_head
    )


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
    length: int | None = None,
) -> Compaction:
    """Keep ``keep`` of the ``seq_len`` tokens of one sequence, in place.

    ``key_caches``: every layer's cache in the FLASH layout, whose key half is scored and
    which is moved; ``value_caches``: separate views moved the same way, when keys and
    values live in different views (``cpu_cache_views``). ``block_table``: the sequence's
    blocks; ``queries``: ``[layers, window, q_heads, dim]``, the post-RoPE queries of its
    last ``window`` tokens. After it, the first ``keep`` slots of the sequence hold the
    kept tokens (not in order: ``positions`` says where each came from) and
    ``freed_blocks`` hold nothing the sequence needs.

    ``length``: the tokens the cache holds (default ``seq_len``), when tokens decoded after
    the scored ``seq_len`` are there too (the watermark trigger compacts running requests):
    those are all kept, after the ``keep`` selected ones, and ``block_table`` covers them.
    """
    backend = backend or default_backend(key_caches[0].device)
    length = _length(seq_len, length)
    kept = _selection(key_caches, block_table, seq_len, queries, keep, config, scale, backend)
    mask = torch.zeros(kept.shape[0], kept.shape[1], length, dtype=torch.bool, device=kept.device)
    mask.scatter_(-1, kept, True)
    mask[..., seq_len:] = True
    plan = plan_in_place(mask, block_table, key_caches[0].shape[2])
    apply_moves(key_caches, KVLayout.FLASH, block_table, plan, backend)
    if value_caches is not None:
        apply_moves(value_caches, KVLayout.FLASH, block_table, plan, backend)
    freed = [int(b) for b in plan.freed_blocks]
    return Compaction(plan.new_length, kept, plan.positions, plan.num_moves, freed)


def compact_into(
    key_caches: Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
    keep: int,
    config: CompactionConfig,
    dst_table: torch.Tensor,
    *,
    value_caches: Sequence[torch.Tensor] | None = None,
    scale: float | None = None,
    backend: Backend | None = None,
    length: int | None = None,
) -> Compaction:
    """``compact_in_place``'s selection, copied in order into the fresh blocks of
    ``dst_table`` (``gather_tokens``) and nothing written in ``block_table``'s: for blocks
    shared with other sequences through the prefix cache. Every old block is freed."""
    backend = backend or default_backend(key_caches[0].device)
    length = _length(seq_len, length)
    kept = _selection(key_caches, block_table, seq_len, queries, keep, config, scale, backend)
    decoded = torch.arange(seq_len, length, device=kept.device)
    positions = torch.cat([kept, decoded.expand(*kept.shape[:2], -1)], -1)
    gather_tokens(key_caches, KVLayout.FLASH, block_table, positions, dst_table, backend)
    if value_caches is not None:
        gather_tokens(value_caches, KVLayout.FLASH, block_table, positions, dst_table, backend)
    freed = [int(b) for b in block_table]
    return Compaction(positions.shape[-1], kept, positions, positions.shape[-1], freed)


def _length(seq_len: int, length: int | None) -> int:
    if length is None:
        return seq_len
    if length < seq_len:
        raise ValueError(f"the cache holds {length} tokens, fewer than the {seq_len} scored")
    return length
