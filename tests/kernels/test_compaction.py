"""Copy kernels against the obvious-loop reference: bit-exact, every dtype and layout."""

from __future__ import annotations

import pytest
import torch

from kernels import (
    KernelInputError,
    KVLayout,
    apply_moves,
    copy_tokens,
    gather_tokens,
    plan_in_place,
)
from kernels.reference import copy_tokens_reference
from tests.kernels.helpers import clone, make_caches, same_bits

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn]
LAYOUTS = list(KVLayout)
BACKENDS = ["triton", "torch"]


def random_keep(layers: int, heads: int, seq_len: int, n: int, per: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = {"sequence": (1, 1), "layer": (layers, 1), "head": (layers, heads)}[per]
    keep = torch.zeros(*rows, seq_len, dtype=torch.bool)
    for idx in range(rows[0] * rows[1]):
        chosen = torch.randperm(seq_len, generator=g)[:n]
        keep.view(-1, seq_len)[idx, chosen] = True
    return keep


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "dim", "block_size", "seq_len", "n_keep", "per"), [
    (2, 72, 16, 45, 20, "sequence"),   # non-power-of-two head dim, partial last block
    (3, 65, 8, 37, 11, "layer"),       # odd head dim (byte copies for fp8/fp16 rows)
    (1, 128, 16, 64, 64, "head"),      # nothing evicted
    (2, 40, 4, 23, 0, "layer"),        # everything evicted
])  # fmt: skip
def test_gather_matches_reference(
    device, backend, layout, dtype, heads, dim, block_size, seq_len, n_keep, per
):
    layers, blocks = 3, 29  # an odd number of physical blocks
    caches = make_caches(layers, layout, blocks, block_size, heads, dim, dtype, device)
    n_src = -(-seq_len // block_size)
    perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(1))
    src_table = perm[:n_src].to(torch.int32).to(device)
    dst_table = perm[n_src : n_src + max(1, -(-n_keep // block_size))].to(torch.int32).to(device)
    mask = random_keep(layers, heads, seq_len, n_keep, per, seed=2)
    keep = mask.nonzero()[:, -1].view(*mask.shape[:2], n_keep).to(device)
    expected = clone(caches)
    full_keep = keep.expand(layers, heads, n_keep).cpu()
    slots = torch.arange(n_keep).expand_as(full_keep)
    copy_tokens_reference(
        [c.cpu() for c in expected], layout, src_table.cpu(), dst_table.cpu(), full_keep, slots
    )
    positions = gather_tokens(caches, layout, src_table, keep, dst_table, backend)
    assert torch.equal(positions.cpu(), full_keep)
    for got, want in zip(caches, expected, strict=True):
        assert same_bits(got.cpu(), want.cpu())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2])
@pytest.mark.parametrize(
    ("seq_len", "n_keep", "per"),
    [(50, 17, "head"), (33, 33, "sequence"), (21, 0, "layer"), (40, 39, "sequence")],
)
def test_in_place_moves_match_reference(device, backend, layout, dtype, seq_len, n_keep, per):
    layers, heads, dim, block_size, blocks = 2, 3, 48, 8, 13
    caches = make_caches(layers, layout, blocks, block_size, heads, dim, dtype, device, seed=5)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(3))[
        : -(-seq_len // block_size)
    ]
    table = table.to(torch.int64).to(device)
    mask = (
        random_keep(layers, heads, seq_len, n_keep, per, seed=4)
        .expand(layers, heads, seq_len)
        .to(device)
    )
    plan = plan_in_place(mask, table, block_size)
    expected = [c.cpu().clone() for c in caches]
    copy_tokens_reference(
        expected, layout, table.cpu(), table.cpu(), plan.src.cpu(), plan.dst.cpu()
    )
    apply_moves(caches, layout, table, plan, backend)
    for got, want in zip(caches, expected, strict=True):
        assert same_bits(got.cpu(), want.cpu())


def test_plan_fills_holes_from_the_tail():
    keep = torch.tensor([[[1, 0, 1, 0, 1, 1, 0, 1, 1, 0]]], dtype=torch.bool)  # 6 kept of 10
    table = torch.tensor([7, 3, 5])
    plan = plan_in_place(keep, table, block_size=4)
    assert plan.new_length == 6
    # holes below 6 are slots 1 and 3; survivors beyond are 7 and 8: the last goes first.
    assert plan.src.tolist() == [[[8, 7]]] and plan.dst.tolist() == [[[1, 3]]]
    assert plan.num_moves == 2  # no more moves than holes below the new length
    assert plan.positions.tolist() == [[[0, 8, 2, 7, 4, 5]]]
    assert plan.block_table.tolist() == [7, 3] and plan.freed_blocks.tolist() == [5]
    assert set(plan.src[plan.src >= 0].tolist()).isdisjoint(plan.dst[plan.dst >= 0].tolist())


@pytest.mark.parametrize("seq_len", [1, 16, 97])
def test_plan_invariants_on_random_masks(seq_len):
    g = torch.Generator().manual_seed(seq_len)
    for _ in range(20):
        n = int(torch.randint(0, seq_len + 1, (1,), generator=g))
        mask = torch.zeros(2, 2, seq_len, dtype=torch.bool)
        for row in mask.view(-1, seq_len):
            row[torch.randperm(seq_len, generator=g)[:n]] = True
        plan = plan_in_place(mask, torch.arange(seq_len), block_size=1)
        active = plan.src >= 0
        assert bool((active.sum(-1) <= seq_len - n).all())  # never more moves than evictions
        assert bool((plan.src[active] >= n).all()) and bool((plan.dst[active] < n).all())
        for r in range(4):  # after the moves every slot holds a kept token, each once
            pos = plan.positions.view(4, n)[r]
            assert sorted(pos.tolist()) == mask.view(4, seq_len)[r].nonzero().flatten().tolist()


def test_launchers_reject_bad_input():
    caches = make_caches(2, KVLayout.FLASH, 4, 4, 2, 8, torch.float16, "cpu")
    table = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(KernelInputError, match="outside"):
        copy_tokens(
            caches,
            KVLayout.FLASH,
            torch.tensor([0, 9]),
            table,
            torch.tensor([0]),
            torch.tensor([0]),
            "triton",
        )
    with pytest.raises(KernelInputError, match="beyond src_table"):
        copy_tokens(
            caches, KVLayout.FLASH, table, table, torch.tensor([8]), torch.tensor([0]), "triton"
        )
    with pytest.raises(KernelInputError, match="strictly increasing"):
        gather_tokens(caches, KVLayout.FLASH, table, torch.tensor([2, 1]), table, "triton")
    with pytest.raises(KernelInputError, match="layer 1"):
        gather_tokens(
            [caches[0], caches[1].float()],
            KVLayout.FLASH,
            table,
            torch.tensor([0]),
            table,
            "triton",
        )
    with pytest.raises(KernelInputError, match="layout expects 2"):
        gather_tokens(caches, KVLayout.TRITON, table, torch.tensor([0]), table, "triton")
    with pytest.raises(KernelInputError, match="same number"):
        plan_in_place(torch.tensor([[[1, 0], [1, 1]]], dtype=torch.bool), table, 4)
