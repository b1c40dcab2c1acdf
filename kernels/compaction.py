"""KV-cache compaction: copy kept tokens, either gathered into fresh blocks or moved in place.

One Triton kernel, ``_copy_tokens_kernel``, moves whole head rows (``head_dim`` elements of
a key or value) between token slots of a paged cache, for every layer, key/value and head in
one launch. It copies integer words, never floats, so fp16, bf16, fp32 and fp8 caches share
it and copies are bit-exact. Two plans feed it:

* ``gather_tokens``: an order-preserving copy of the kept tokens into fresh blocks;
* ``plan_in_place`` + ``apply_moves``: "fill the holes from the tail" (KV-Compress): the
  kept tokens beyond the new length move into the evicted slots below it, lowest hole
  first, last survivor first. Only as many moves as there are holes below the new length,
  sources (>= new length) are never destinations (< new length), so the copy is safe in
  place and in parallel; the trailing blocks are freed. Order is not preserved, so the plan
  returns the original position of every slot.

Selections may differ per layer and per KV head (shape ``[layers, heads, n]``, broadcast
from ``[n]`` or ``[layers, n]``), but every row keeps the same number of tokens because a
sequence has one block table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

from kernels.layout import (
    CacheGeometry,
    KernelInputError,
    KVLayout,
    check_caches,
    layer_offsets,
    word_view,
)

Backend = Literal["triton", "torch"]


@triton.jit  # type: ignore[untyped-decorator]
def _copy_tokens_kernel(  # type: ignore[no-untyped-def]
    cache_ptr,  # layer 0 of the caches, viewed as integer words
    layer_off_ptr,  # [L] int64: word offset of each layer from layer 0
    src_table_ptr,  # [n_src_blocks] physical block ids of the source sequence
    dst_table_ptr,  # [n_dst_blocks] physical block ids of the destination
    src_pos_ptr,  # [L, H, M] int64 logical source positions, -1 = nothing to do
    dst_pos_ptr,  # [L, H, M] int64 logical destination positions
    stride_pos_l,
    stride_pos_h,
    M,
    stride_kv,  # word strides of the cache
    stride_block,
    stride_slot,
    stride_head,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    ROW_WORDS: tl.constexpr,  # words in one head row
    BLOCK_M: tl.constexpr,  # token copies per program
    BLOCK_W: tl.constexpr,  # next power of two >= ROW_WORDS
):
    pid_m = tl.program_id(0).to(tl.int64)
    layer_kv = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    layer = layer_kv // 2
    kv = layer_kv % 2

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    in_range = m < M
    row = layer * stride_pos_l + head * stride_pos_h
    src = tl.load(src_pos_ptr + row + m, mask=in_range, other=-1)
    dst = tl.load(dst_pos_ptr + row + m, mask=in_range, other=-1)
    active = in_range & (src >= 0)

    src_block = tl.load(src_table_ptr + src // BLOCK_SIZE, mask=active, other=0).to(tl.int64)
    dst_block = tl.load(dst_table_ptr + dst // BLOCK_SIZE, mask=active, other=0).to(tl.int64)
    base = cache_ptr + tl.load(layer_off_ptr + layer) + kv * stride_kv + head * stride_head
    src_row = base + src_block * stride_block + (src % BLOCK_SIZE) * stride_slot  # [BLOCK_M]
    dst_row = base + dst_block * stride_block + (dst % BLOCK_SIZE) * stride_slot

    w = tl.arange(0, BLOCK_W)
    mask = active[:, None] & (w < ROW_WORDS)[None, :]
    words = tl.load(src_row[:, None] + w[None, :], mask=mask)  # [BLOCK_M, BLOCK_W]
    tl.store(dst_row[:, None] + w[None, :], words, mask=mask)


@dataclass(frozen=True, slots=True)
class MovePlan:
    """An in-place compaction of one sequence.

    ``src``/``dst``: ``[layers, heads, moves]`` logical positions (-1 padded);
    ``positions``: ``[layers, heads, new_length]`` original position of each slot after the
    moves; ``block_table``: the blocks the sequence keeps; ``freed_blocks``: the rest.
    """

    src: torch.Tensor
    dst: torch.Tensor
    new_length: int
    positions: torch.Tensor
    block_table: torch.Tensor
    freed_blocks: torch.Tensor

    @property
    def num_moves(self) -> int:
        return int((self.src >= 0).sum())


def _rows(x: torch.Tensor, layers: int, heads: int, what: str) -> torch.Tensor:
    """Broadcast a per-token tensor to ``[layers, heads, n]``."""
    if x.dim() == 1:
        x = x[None, None]
    elif x.dim() == 2:
        x = x[:, None]
    if x.dim() != 3 or x.shape[0] not in (1, layers) or x.shape[1] not in (1, heads):
        raise KernelInputError(
            f"{what} must be [n], [layers, n] or [layers, heads, n], got {tuple(x.shape)}"
        )
    return x.expand(layers, heads, x.shape[-1])


def _check_table(table: torch.Tensor, geo: CacheGeometry, device: torch.device, what: str) -> None:
    if table.dim() != 1 or table.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(
            f"{what} must be a 1-D int32/int64 tensor, got {table.dtype} {tuple(table.shape)}"
        )
    if table.device != device:
        raise KernelInputError(f"{what} is on {table.device}, the caches on {device}")
    if table.numel() and (int(table.min()) < 0 or int(table.max()) >= geo.num_blocks):
        raise KernelInputError(f"{what} holds block ids outside [0, {geo.num_blocks})")


def copy_tokens(
    caches: Sequence[torch.Tensor],
    layout: KVLayout,
    src_table: torch.Tensor,
    dst_table: torch.Tensor,
    src_pos: torch.Tensor,
    dst_pos: torch.Tensor,
    backend: Backend,
) -> None:
    """Copy head rows ``src_pos -> dst_pos`` (``[L, H, M]``, -1 skips) in every layer, K and V.

    Validates everything the Triton interpreter would not: shapes, dtypes, devices, and that
    every position lands inside its block table and every block inside the cache.
    """
    geo = check_caches(caches, layout)
    device = caches[0].device
    layers, heads = len(caches), geo.kv_heads
    _check_table(src_table, geo, device, "src_table")
    _check_table(dst_table, geo, device, "dst_table")
    src_pos, dst_pos = (
        _rows(src_pos, layers, heads, "src_pos"),
        _rows(dst_pos, layers, heads, "dst_pos"),
    )
    if src_pos.shape != dst_pos.shape:
        raise KernelInputError(
            f"src_pos {tuple(src_pos.shape)} and dst_pos {tuple(dst_pos.shape)} differ"
        )
    active = src_pos >= 0
    if bool((active & (dst_pos < 0)).any()):
        raise KernelInputError("a copy has a source but no destination")
    if bool(active.any()):
        if int(src_pos[active].max()) >= src_table.numel() * geo.block_size:
            raise KernelInputError("a source position lies beyond src_table")
        if int(dst_pos[active].max()) >= dst_table.numel() * geo.block_size:
            raise KernelInputError("a destination position lies beyond dst_table")
    if src_pos.shape[-1] == 0 or not bool(active.any()):
        return
    if backend == "torch":
        _copy_tokens_torch(caches, layout, src_table, dst_table, src_pos, dst_pos, geo)
        return
    views, word = word_view(caches)
    wstrides = views[0].stride()
    kv_s, block_s = (
        (wstrides[0], wstrides[1]) if layout is KVLayout.FLASH else (wstrides[1], wstrides[0])
    )
    row_words = views[0].shape[-1]
    src_pos = src_pos.to(torch.int64).contiguous()
    dst_pos = dst_pos.to(torch.int64).contiguous()
    m = src_pos.shape[-1]
    block_m = min(64, triton.next_power_of_2(m))
    grid = (triton.cdiv(m, block_m), layers * 2, heads)
    _copy_tokens_kernel[grid](
        views[0], layer_offsets(views, word), src_table, dst_table, src_pos, dst_pos,
        src_pos.stride(0), src_pos.stride(1), m,
        kv_s, block_s, wstrides[2], wstrides[3],
        BLOCK_SIZE=geo.block_size, ROW_WORDS=row_words, BLOCK_M=block_m,
        BLOCK_W=triton.next_power_of_2(row_words),
    )  # fmt: skip


def _as_flash(cache: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    return cache if layout is KVLayout.FLASH else cache.transpose(0, 1)


def _copy_tokens_torch(
    caches: Sequence[torch.Tensor],
    layout: KVLayout,
    src_table: torch.Tensor,
    dst_table: torch.Tensor,
    src_pos: torch.Tensor,
    dst_pos: torch.Tensor,
    geo: CacheGeometry,
) -> None:
    """Vectorized torch path for machines without a GPU: one indexed copy per layer."""
    bs = geo.block_size
    heads = torch.arange(geo.kv_heads, device=src_pos.device)[:, None].expand_as(src_pos[0])
    for layer, cache in enumerate(caches):
        c = _as_flash(cache, layout)
        active = src_pos[layer] >= 0
        s, d, h = src_pos[layer][active], dst_pos[layer][active], heads[active]
        src_blocks, dst_blocks = src_table[s // bs].long(), dst_table[d // bs].long()
        for half in c:  # key, value: one at a time, so a view whose halves alias works too
            half[dst_blocks, d % bs, h] = half[src_blocks, s % bs, h]  # the source is read first


def gather_tokens(
    caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    keep: torch.Tensor,
    dst_table: torch.Tensor,
    backend: Backend,
) -> torch.Tensor:
    """Copy the kept tokens, in order, into the blocks of ``dst_table``; returns their positions.

    ``keep``: sorted token positions, ``[n]``, ``[layers, n]`` or ``[layers, heads, n]``.
    The result, ``[layers, heads, n]``, is the original position of each new slot.
    """
    geo = check_caches(caches, layout)
    keep = _rows(keep, len(caches), geo.kv_heads, "keep")
    if keep.shape[-1] > 1 and bool((keep[..., 1:] <= keep[..., :-1]).any()):
        raise KernelInputError("keep must be strictly increasing in every row")
    if keep.numel() and int(keep.min()) < 0:
        raise KernelInputError("keep holds a negative position")
    n = keep.shape[-1]
    if dst_table.numel() * geo.block_size < n:
        raise KernelInputError(f"dst_table holds {dst_table.numel()} blocks, {n} tokens need more")
    slots = torch.arange(n, device=keep.device).expand_as(keep)
    copy_tokens(caches, layout, block_table, dst_table, keep, slots, backend)
    return keep.clone()


def plan_in_place(keep_mask: torch.Tensor, block_table: torch.Tensor, block_size: int) -> MovePlan:
    """Plan "fill holes from the tail" for a ``[layers, heads, seq_len]`` (or broadcast) mask."""
    if keep_mask.dtype != torch.bool or keep_mask.dim() != 3:
        raise KernelInputError(
            f"keep_mask must be a 3-D bool tensor, got {keep_mask.dtype} {tuple(keep_mask.shape)}"
        )
    layers, heads, seq_len = keep_mask.shape
    if block_table.numel() * block_size < seq_len:
        raise KernelInputError("the block table is shorter than the sequence")
    counts = keep_mask.sum(-1)
    new_length = int(counts.flatten()[0]) if counts.numel() else 0
    if bool((counts != new_length).any()):
        raise KernelInputError(
            f"every (layer, head) must keep the same number of tokens, got {torch.unique(counts).tolist()}"
        )
    pos = torch.arange(seq_len, device=keep_mask.device).expand_as(keep_mask)
    big = seq_len + 1
    holes = (~keep_mask) & (pos < new_length)
    movers = keep_mask & (pos >= new_length)
    n_moves = int(holes.sum(-1).max()) if holes.numel() else 0
    # Lowest holes first, paired with the last survivors first.
    dst = torch.sort(torch.where(holes, pos, big), dim=-1).values[..., :n_moves]
    src = torch.sort(torch.where(movers, pos, -1), dim=-1, descending=True).values[..., :n_moves]
    src = torch.where(dst < big, src, -1)
    dst = torch.where(dst < big, dst, -1)
    positions = torch.arange(new_length, device=keep_mask.device).repeat(layers, heads, 1)
    li, hi, mi = (src >= 0).nonzero(as_tuple=True)
    positions[li, hi, dst[li, hi, mi]] = src[li, hi, mi]
    kept_blocks = -(-new_length // block_size)
    used_blocks = -(-seq_len // block_size)
    return MovePlan(
        src=src, dst=dst, new_length=new_length, positions=positions,
        block_table=block_table[:kept_blocks], freed_blocks=block_table[kept_blocks:used_blocks],
    )  # fmt: skip


def apply_moves(
    caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    plan: MovePlan,
    backend: Backend,
) -> None:
    """Execute an in-place plan on the caches (``block_table``: the sequence's table before it)."""
    copy_tokens(caches, layout, block_table, block_table, plan.src, plan.dst, backend)
