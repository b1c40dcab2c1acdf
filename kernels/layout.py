"""Paged KV-cache layouts and the per-layer pointer table shared by every kernel.

vLLM keeps one cache tensor per layer, in one of two layouts:

    FLASH:  [2, num_blocks, block_size, kv_heads, head_dim]   (FlashAttention backend)
    TRITON: [num_blocks, 2, block_size, kv_heads, head_dim]   (Triton / FlashInfer backends)

Kernels never assume contiguity: they receive the five strides (kv, block, slot, head,
dim) of the layout, and reach every layer from one launch through a table of offsets,
in elements of a common view, from layer 0's data pointer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch


class KVLayout(StrEnum):
    FLASH = "flash"  # [2, blocks, block_size, heads, dim]
    TRITON = "triton"  # [blocks, 2, block_size, heads, dim]


class KernelInputError(ValueError):
    """A kernel's inputs have the wrong shape, dtype, device, strides or index range."""


@dataclass(frozen=True, slots=True)
class CacheGeometry:
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    # element strides of (kv, block, slot, head, dim)
    strides: tuple[int, int, int, int, int]


def geometry(cache: torch.Tensor, layout: KVLayout) -> CacheGeometry:
    if cache.dim() != 5:
        raise KernelInputError(f"a KV cache has 5 dimensions, got shape {tuple(cache.shape)}")
    s = cache.stride()
    if layout is KVLayout.FLASH:
        two, blocks, block_size, heads, dim = cache.shape
        strides = (s[0], s[1], s[2], s[3], s[4])
    else:
        blocks, two, block_size, heads, dim = cache.shape
        strides = (s[1], s[0], s[2], s[3], s[4])
    if two != 2:
        raise KernelInputError(
            f"{layout} layout expects 2 (key, value) at dim {0 if layout is KVLayout.FLASH else 1}, "
            f"got shape {tuple(cache.shape)}"
        )
    return CacheGeometry(blocks, block_size, heads, dim, strides)


def check_caches(caches: Sequence[torch.Tensor], layout: KVLayout) -> CacheGeometry:
    """All layers must share shape, strides, dtype and device; returns their geometry."""
    if not caches:
        raise KernelInputError("no cache layers given")
    first = caches[0]
    geo = geometry(first, layout)
    for i, c in enumerate(caches[1:], start=1):
        if c.shape != first.shape or c.stride() != first.stride():
            raise KernelInputError(
                f"layer {i} has shape {tuple(c.shape)} strides {c.stride()}, layer 0 has "
                f"{tuple(first.shape)} {first.stride()}"
            )
        if c.dtype != first.dtype or c.device != first.device:
            raise KernelInputError(
                f"layer {i} is {c.dtype} on {c.device}, layer 0 {first.dtype} on {first.device}"
            )
    return geo


def layer_offsets(caches: Sequence[torch.Tensor], unit_bytes: int) -> torch.Tensor:
    """int64 offsets, in units of ``unit_bytes``, of each layer's data from layer 0's."""
    base = caches[0].data_ptr()
    offsets = []
    for i, c in enumerate(caches):
        delta = c.data_ptr() - base
        if delta % unit_bytes:
            raise KernelInputError(
                f"layer {i} is not aligned to {unit_bytes} bytes relative to layer 0"
            )
        offsets.append(delta // unit_bytes)
    return torch.tensor(offsets, dtype=torch.int64, device=caches[0].device)


def word_view(caches: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    """The caches viewed as the widest integer word that divides a head row (byte copies).

    fp16, bf16, fp32 and fp8 caches all become integer tensors, so one copy kernel moves
    them bit for bit.
    """
    first = caches[0]
    if first.stride(-1) != 1:
        raise KernelInputError("head_dim must be the innermost, contiguous dimension")
    row_bytes = first.shape[-1] * first.element_size()
    for word, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2), (torch.uint8, 1)):
        if row_bytes % size == 0 and all(
            s * first.element_size() % size == 0 for s in first.stride()[:-1]
        ):
            return [c.view(torch.uint8).view(word) for c in caches], size
    raise AssertionError("unreachable: uint8 always divides")
