"""SnapKV-style token scores over a paged KV cache, for every layer in one launch.

For the queries of an observation window (the last ``W`` tokens of a sequence), the
attention each cached token receives — softmax probabilities summed over the window and
over the query heads that share its KV head (grouped-query attention) — per layer and KV
head, then pooled over neighbouring tokens as SnapKV does. FlashAttention never exposes its
probabilities, so they are recomputed here from the cached keys, in two passes:

1. ``_window_lse_kernel``: each window query's log-sum-exp over the keys it may see
   (causal), streaming over key tiles with an online max;
2. ``_token_scores_kernel``: each program owns a tile of keys, recomputes their logits
   against every window query of its head group and adds up ``exp(logit - lse)``.
   No atomics: every key tile has exactly one writer.

Keys are upcast to fp32 (fp16, bf16, fp32 caches; fp8 would need its scales).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.layout import KernelInputError, KVLayout, check_caches, layer_offsets

Backend = Literal["triton", "torch"]
SCORE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit  # type: ignore[untyped-decorator]
def _load_keys(  # type: ignore[no-untyped-def]
    base, table_ptr, t, t_mask, d, d_mask, stride_block, stride_slot, BLOCK_SIZE: tl.constexpr
):
    """Keys of tokens ``t`` ([BLOCK_N]) for one (layer, kv head), as fp32 [BLOCK_N, BLOCK_D]."""
    block = tl.load(table_ptr + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
    rows = base + block * stride_block + (t % BLOCK_SIZE) * stride_slot
    k = tl.load(rows[:, None] + d[None, :], mask=t_mask[:, None] & d_mask[None, :], other=0.0)
    return k.to(tl.float32)


@triton.jit
def _load_queries(  # type: ignore[no-untyped-def]
    q_ptr, layer, qh, w, w_mask, d, d_mask, stride_ql, stride_qw, stride_qh
):
    """Window queries ``w`` ([BLOCK_Q]) of one (layer, query head), as fp32 [BLOCK_Q, BLOCK_D]."""
    rows = q_ptr + layer * stride_ql + w * stride_qw + qh * stride_qh
    q = tl.load(rows[:, None] + d[None, :], mask=w_mask[:, None] & d_mask[None, :], other=0.0)
    return q.to(tl.float32)


@triton.jit  # type: ignore[untyped-decorator]
def _window_lse_kernel(  # type: ignore[no-untyped-def]
    cache_ptr, layer_off_ptr, table_ptr,
    q_ptr, stride_ql, stride_qw, stride_qh,  # queries [L, W, Hq, D], D contiguous
    lse_ptr,  # out: [L, Hq, W] fp32
    seq_len, window, scale,
    stride_block, stride_slot, stride_head,  # element strides of the key half of the cache
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    layer = tl.program_id(0).to(tl.int64)
    qh = tl.program_id(1).to(tl.int64)
    pid_q = tl.program_id(2).to(tl.int64)
    w = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    w_mask = w < window
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = _load_queries(q_ptr, layer, qh, w, w_mask, d, d_mask, stride_ql, stride_qw, stride_qh)
    q_pos = seq_len - window + w  # absolute position of each query
    base = cache_ptr + tl.load(layer_off_ptr + layer) + (qh // GROUP) * stride_head
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        t_mask = t < seq_len
        k = _load_keys(base, table_ptr, t, t_mask, d, d_mask, stride_block, stride_slot, BLOCK_SIZE)
        logits = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_Q, BLOCK_N]
        visible = t_mask[None, :] & (t[None, :] <= q_pos[:, None])
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), axis=1)
        m_i = m_new
    lse = m_i + tl.log(l_i)
    tl.store(lse_ptr + (layer * tl.num_programs(1) + qh) * window + w, lse, mask=w_mask)


@triton.jit  # type: ignore[untyped-decorator]
def _token_scores_kernel(  # type: ignore[no-untyped-def]
    cache_ptr, layer_off_ptr, table_ptr,
    q_ptr, stride_ql, stride_qw, stride_qh,
    lse_ptr,  # [L, Hq, W]
    out_ptr,  # out: [L, Hkv, seq_len] fp32
    seq_len, window, scale, q_heads, kv_heads,
    stride_block, stride_slot, stride_head,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    layer = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    pid_n = tl.program_id(2).to(tl.int64)
    t = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    t_mask = t < seq_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    base = cache_ptr + tl.load(layer_off_ptr + layer) + kvh * stride_head
    k = _load_keys(base, table_ptr, t, t_mask, d, d_mask, stride_block, stride_slot, BLOCK_SIZE)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for g in range(GROUP):
        qh = kvh * GROUP + g
        for start in range(0, window, BLOCK_Q):
            w = start + tl.arange(0, BLOCK_Q)
            w_mask = w < window
            q = _load_queries(
                q_ptr, layer, qh, w, w_mask, d, d_mask, stride_ql, stride_qw, stride_qh
            )
            lse = tl.load(lse_ptr + (layer * q_heads + qh) * window + w, mask=w_mask, other=0.0)
            logits = tl.dot(q, tl.trans(k)) * scale
            q_pos = seq_len - window + w
            visible = w_mask[:, None] & t_mask[None, :] & (t[None, :] <= q_pos[:, None])
            p = tl.where(visible, tl.exp(logits - lse[:, None]), 0.0)
            acc += tl.sum(p, axis=0)
    tl.store(out_ptr + (layer * kv_heads + kvh) * seq_len + t, acc, mask=t_mask)


def _check(
    key_caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
) -> tuple[int, int]:
    geo = check_caches(key_caches, layout)
    if key_caches[0].dtype not in SCORE_DTYPES:
        raise KernelInputError(
            f"scoring reads fp16, bf16 or fp32 caches, not {key_caches[0].dtype}"
        )
    if (
        queries.dim() != 4
        or queries.shape[0] != len(key_caches)
        or queries.shape[3] != geo.head_dim
    ):
        raise KernelInputError(
            f"queries must be [layers={len(key_caches)}, window, q_heads, head_dim={geo.head_dim}], "
            f"got {tuple(queries.shape)}"
        )
    q_heads, window = queries.shape[2], queries.shape[1]
    if q_heads % geo.kv_heads:
        raise KernelInputError(f"{q_heads} query heads do not divide into {geo.kv_heads} KV heads")
    if not 0 < window <= seq_len:
        raise KernelInputError(f"window {window} must be in 1..seq_len ({seq_len})")
    if queries.device != key_caches[0].device or block_table.device != key_caches[0].device:
        raise KernelInputError("queries, block table and caches must share a device")
    if block_table.dim() != 1 or block_table.dtype not in (torch.int32, torch.int64):
        raise KernelInputError("block_table must be a 1-D int32/int64 tensor")
    needed = -(-seq_len // geo.block_size)
    if block_table.numel() < needed:
        raise KernelInputError(
            f"block_table has {block_table.numel()} blocks, seq_len {seq_len} needs {needed}"
        )
    used = block_table[:needed]
    if int(used.min()) < 0 or int(used.max()) >= geo.num_blocks:
        raise KernelInputError(f"block_table holds block ids outside [0, {geo.num_blocks})")
    return q_heads, window


def attention_scores(
    key_caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
    backend: Backend,
    scale: float | None = None,
) -> torch.Tensor:
    """Unpooled scores ``[layers, kv_heads, seq_len]`` (fp32). ``key_caches``: each layer's
    whole KV cache (the key half is read). ``queries``: ``[layers, window, q_heads, dim]``."""
    q_heads, window = _check(key_caches, layout, block_table, seq_len, queries)
    geo = check_caches(key_caches, layout)
    scale = 1.0 / math.sqrt(geo.head_dim) if scale is None else scale
    if backend == "torch":
        return _scores_torch(key_caches, layout, block_table, seq_len, queries, scale)
    layers, device = len(key_caches), queries.device
    queries = queries if queries.stride(-1) == 1 else queries.contiguous()
    _, s_block, s_slot, s_head, s_dim = geo.strides
    if s_dim != 1:
        raise KernelInputError("head_dim must be contiguous in the cache")
    offsets = layer_offsets(key_caches, key_caches[0].element_size())
    group = q_heads // geo.kv_heads
    block_q = max(16, min(64, triton.next_power_of_2(window)))
    block_n = 64
    block_d = triton.next_power_of_2(geo.head_dim)
    lse = torch.empty(layers, q_heads, window, dtype=torch.float32, device=device)
    common = {"GROUP": group, "HEAD_DIM": geo.head_dim, "BLOCK_SIZE": geo.block_size,
              "BLOCK_Q": block_q, "BLOCK_N": block_n, "BLOCK_D": block_d}  # fmt: skip
    ql, qw, qh = queries.stride(0), queries.stride(1), queries.stride(2)
    _window_lse_kernel[(layers, q_heads, triton.cdiv(window, block_q))](
        key_caches[0], offsets, block_table, queries, ql, qw, qh, lse,
        seq_len, window, scale, s_block, s_slot, s_head, **common,
    )  # fmt: skip
    out = torch.empty(layers, geo.kv_heads, seq_len, dtype=torch.float32, device=device)
    _token_scores_kernel[(layers, geo.kv_heads, triton.cdiv(seq_len, block_n))](
        key_caches[0], offsets, block_table, queries, ql, qw, qh, lse, out,
        seq_len, window, scale, q_heads, geo.kv_heads, s_block, s_slot, s_head, **common,
    )  # fmt: skip
    return out


def _gather_keys(
    cache: torch.Tensor, layout: KVLayout, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    keys = cache[0] if layout is KVLayout.FLASH else cache[:, 0]  # [blocks, block_size, H, D]
    t = torch.arange(seq_len, device=cache.device)
    block_size = keys.shape[1]
    return keys[block_table[t // block_size].long(), t % block_size]  # [T, H, D]


def _scores_torch(
    key_caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Vectorized torch path (CPU machines): one layer at a time, [Hq, W, T] logits each."""
    layers, window, q_heads, _ = queries.shape
    kv_heads = key_caches[0].shape[3]
    group = q_heads // kv_heads
    t = torch.arange(seq_len, device=queries.device)
    q_pos = seq_len - window + torch.arange(window, device=queries.device)
    visible = t[None, :] <= q_pos[:, None]  # [W, T]
    out = torch.empty(layers, kv_heads, seq_len, dtype=torch.float32, device=queries.device)
    for layer in range(layers):
        k = _gather_keys(key_caches[layer], layout, block_table, seq_len).float()  # [T, Hkv, D]
        k = k.repeat_interleave(group, dim=1)  # [T, Hq, D]
        q = queries[layer].float()  # [W, Hq, D]
        logits = torch.einsum("whd,thd->hwt", q, k) * scale
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        out[layer] = probs.sum(dim=1).view(kv_heads, group, seq_len).sum(dim=1)
    return out


def pool_scores(
    scores: torch.Tensor, kernel_size: int = 7, mode: Literal["max", "avg"] = "max"
) -> torch.Tensor:
    """SnapKV's smoothing: each token takes the max (or mean) score of its neighbourhood, so
    kept tokens come with their context rather than as isolated spikes."""
    if kernel_size <= 1:
        return scores
    if kernel_size % 2 == 0:
        raise KernelInputError("pooling kernel_size must be odd (the window is centred)")
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    pad = kernel_size // 2
    if mode == "max":
        pooled = F.max_pool1d(flat, kernel_size, stride=1, padding=pad)
    else:
        pooled = F.avg_pool1d(flat, kernel_size, stride=1, padding=pad, count_include_pad=False)
    return pooled.reshape(shape)


def score_tokens(
    key_caches: Sequence[torch.Tensor],
    layout: KVLayout,
    block_table: torch.Tensor,
    seq_len: int,
    queries: torch.Tensor,
    backend: Backend,
    *,
    scale: float | None = None,
    pool_kernel: int = 7,
    pool: Literal["max", "avg"] = "max",
) -> torch.Tensor:
    """Pooled token scores ``[layers, kv_heads, seq_len]``: the input of ``select_tokens``."""
    raw = attention_scores(key_caches, layout, block_table, seq_len, queries, backend, scale)
    return pool_scores(raw, pool_kernel, pool)
