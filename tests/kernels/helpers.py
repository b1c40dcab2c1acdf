from __future__ import annotations

import torch

from kernels import KVLayout


def make_caches(layers: int, layout: KVLayout, blocks: int, block_size: int, heads: int, dim: int,
                dtype: torch.dtype, device: str, seed: int = 0) -> list[torch.Tensor]:  # fmt: skip
    """Random caches; fp8 is filled through its bytes so every bit pattern is exercised."""
    g = torch.Generator().manual_seed(seed)
    shape = (
        (2, blocks, block_size, heads, dim)
        if layout is KVLayout.FLASH
        else (blocks, 2, block_size, heads, dim)
    )
    caches = []
    for _ in range(layers):
        if dtype.is_floating_point and torch.finfo(dtype).bits == 8:
            raw = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
            caches.append(raw.view(dtype).to(device))
        else:
            caches.append(torch.randn(shape, generator=g).to(dtype).to(device))
    return caches


def clone(caches: list[torch.Tensor]) -> list[torch.Tensor]:
    return [c.clone() for c in caches]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
