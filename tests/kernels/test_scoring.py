"""Scoring kernels against the obvious-loop reference; selection rules."""

from __future__ import annotations

import pytest
import torch

from kernels import (
    KernelInputError,
    KVLayout,
    attention_scores,
    pool_scores,
    score_tokens,
    select_tokens,
)
from kernels.reference import score_tokens_reference
from tests.kernels.helpers import make_caches

# Per-dtype tolerance on probabilities summed over the window (values up to ~W * group).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 1e-3}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("q_heads", "kv_heads", "dim", "block_size", "seq_len", "window"), [
    (4, 2, 40, 16, 70, 8),    # GQA 2:1, non-power-of-two head dim, odd length
    (3, 3, 32, 8, 17, 17),    # multi-head, window = whole sequence
    (6, 1, 24, 4, 37, 5),     # multi-query (6:1)
])  # fmt: skip
def test_scores_match_reference(
    device, backend, layout, dtype, q_heads, kv_heads, dim, block_size, seq_len, window
):
    layers, blocks = 2, 23
    caches = make_caches(layers, layout, blocks, block_size, kv_heads, dim, dtype, device, seed=7)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(8))[
        : -(-seq_len // block_size)
    ]
    table = table.to(torch.int32).to(device)
    queries = (
        torch.randn(layers, window, q_heads, dim, generator=torch.Generator().manual_seed(9))
        .to(dtype)
        .to(device)
    )
    got = attention_scores(caches, layout, table, seq_len, queries, backend)
    want = score_tokens_reference(
        [c.cpu() for c in caches], layout, table.cpu(), seq_len, queries.cpu()
    )
    torch.testing.assert_close(got.cpu(), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    # Every query's probabilities sum to one, so the scores add up to window * group.
    totals = got.sum(-1).cpu()
    torch.testing.assert_close(
        totals, torch.full_like(totals, window * q_heads / kv_heads), rtol=1e-4, atol=1e-3
    )


def test_strided_queries_and_scale(device):
    caches = make_caches(1, KVLayout.FLASH, 6, 4, 2, 16, torch.float32, device)
    table = torch.arange(6, dtype=torch.int64, device=device)
    base = torch.randn(1, 4, 16, 4, device=device)
    queries = base.transpose(2, 3)  # [1, 4, 4 heads, 16] with a non-unit stride on heads
    got = attention_scores(caches, KVLayout.FLASH, table, 21, queries, "triton", scale=0.3)
    want = score_tokens_reference(
        [c.cpu() for c in caches], KVLayout.FLASH, table.cpu(), 21, queries.cpu(), 0.3
    )
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_scoring_rejects_bad_input():
    caches = make_caches(2, KVLayout.FLASH, 4, 4, 2, 8, torch.float16, "cpu")
    table = torch.arange(4, dtype=torch.int32)
    q = torch.randn(2, 3, 4, 8, dtype=torch.float16)
    with pytest.raises(KernelInputError, match="window"):
        attention_scores(caches, KVLayout.FLASH, table, 2, q, "triton")
    with pytest.raises(KernelInputError, match="divide"):
        attention_scores(caches, KVLayout.FLASH, table, 10, torch.randn(2, 3, 3, 8), "triton")
    with pytest.raises(KernelInputError, match="needs"):
        attention_scores(caches, KVLayout.FLASH, table[:2], 10, q, "triton")
    with pytest.raises(KernelInputError, match="outside"):
        attention_scores(
            caches, KVLayout.FLASH, torch.tensor([0, 1, 7], dtype=torch.int32), 10, q, "triton"
        )
    with pytest.raises(KernelInputError, match="fp16, bf16 or fp32"):
        fp8 = [c.to(torch.float8_e4m3fn) for c in caches]
        attention_scores(fp8, KVLayout.FLASH, table, 10, q, "triton")


def test_pooling_spreads_a_spike_to_its_neighbours():
    scores = torch.zeros(1, 1, 9)
    scores[0, 0, 4] = 1.0
    assert pool_scores(scores, 3).flatten().tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert pool_scores(scores, 1) is scores
    with pytest.raises(KernelInputError):
        pool_scores(scores, 4)


def test_score_tokens_pools_the_raw_scores():
    caches = make_caches(1, KVLayout.TRITON, 5, 4, 1, 8, torch.float32, "cpu")
    table = torch.arange(5)
    q = torch.randn(1, 4, 2, 8)
    raw = attention_scores(caches, KVLayout.TRITON, table, 18, q, "torch")
    torch.testing.assert_close(
        score_tokens(caches, KVLayout.TRITON, table, 18, q, "torch", pool_kernel=5),
        pool_scores(raw, 5),
    )


def test_selection_keeps_sinks_window_and_top_scores():
    scores = torch.zeros(1, 2, 20)
    scores[0, 0, 10] = 5.0  # head 0 likes token 10
    scores[0, 1, 12] = 9.0  # head 1 likes token 12 more
    scores[0, 0, 7] = 1.0
    keep = select_tokens(scores, budget=7, sinks=2, window=3)
    # per layer: the mean over heads ranks 12 (4.5) above 10 (2.5) above 7 (0.5)
    assert keep.tolist() == [[[0, 1, 10, 12, 17, 18, 19]]]
    per_head = select_tokens(scores, budget=6, sinks=2, window=3, per_head=True)
    assert per_head.tolist() == [[[0, 1, 10, 17, 18, 19], [0, 1, 12, 17, 18, 19]]]


def test_selection_edge_cases():
    scores = torch.rand(2, 3, 10)
    assert select_tokens(scores, budget=10).tolist() == [[list(range(10))]] * 2
    assert select_tokens(scores, budget=50, per_head=True).shape == (2, 3, 10)
    assert select_tokens(scores, budget=0, sinks=0, window=0).shape == (2, 1, 0)
    ties = select_tokens(torch.zeros(1, 1, 10), budget=3, sinks=0, window=0)
    assert ties.tolist() == [[[0, 1, 2]]]  # equal scores: the earlier tokens
    with pytest.raises(KernelInputError, match="exceed the budget"):
        select_tokens(scores, budget=5, sinks=4, window=4)
