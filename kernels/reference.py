"""Plain-torch references, written as the obvious loops. Slow; for tests only."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kernels.layout import KVLayout


def _row(
    cache: torch.Tensor, layout: KVLayout, kv: int, block: int, slot: int, head: int
) -> torch.Tensor:
    if layout is KVLayout.FLASH:
        return cache[kv, block, slot, head]
    return cache[block, kv, slot, head]


def copy_tokens_reference(
    caches: Sequence[torch.Tensor],
    layout: KVLayout,
    src_table: torch.Tensor,
    dst_table: torch.Tensor,
    src_pos: torch.Tensor,  # [L, H, M]
    dst_pos: torch.Tensor,
) -> None:
    block_size = caches[0].shape[2]
    for layer, cache in enumerate(caches):
        for kv in range(2):
            for head in range(src_pos.shape[1]):
                rows = []
                for m in range(src_pos.shape[2]):
                    s, d = int(src_pos[layer, head, m]), int(dst_pos[layer, head, m])
                    if s < 0:
                        continue
                    src = _row(
                        cache, layout, kv, int(src_table[s // block_size]), s % block_size, head
                    )
                    rows.append((d, src.clone()))
                for d, value in rows:  # read everything first: in-place plans stay safe
                    _row(
                        cache, layout, kv, int(dst_table[d // block_size]), d % block_size, head
                    ).copy_(value)


def score_tokens_reference(
    key_caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,  # [L, W, Hq, D]: the last W tokens' queries
    scale: float | None = None,
) -> torch.Tensor:
    """Attention each cached token receives from the window queries: ``[L, Hkv, seq_len]``.

    For query ``w`` (absolute position ``seq_len - W + w``) softmax over keys ``0..pos``;
    probabilities summed over the window and over the query heads of each KV head's group.
    """
    layers, window, q_heads, dim = queries.shape
    block_size = key_caches[0].shape[2]
    kv_heads = key_caches[0].shape[3]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    scores = torch.zeros(layers, kv_heads, seq_len, dtype=torch.float32)
    for layer in range(layers):
        for qh in range(q_heads):
            kvh = qh // group
            keys = torch.stack(
                [
                    _row(
                        key_caches[layer],
                        layout,
                        0,
                        int(block_table[t // block_size]),
                        t % block_size,
                        kvh,
                    )
                    for t in range(seq_len)
                ]
            ).float()
            for w in range(window):
                pos = seq_len - window + w
                q = queries[layer, w, qh].float()
                logits = (keys[: pos + 1] @ q) * scale
                scores[layer, kvh, : pos + 1] += torch.softmax(logits, dim=0)
    return scores
