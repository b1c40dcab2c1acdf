"""The plugin's pure parts, in the gateway's environment: the budget arithmetic both vLLM
processes share, and compaction through the views of vLLM's CPU cache layout."""

from __future__ import annotations

import pytest
import torch

from kernels.layout import KVLayout
from kernels.reference import score_tokens_reference
from kernels.scoring import pool_scores
from kernels.selection import select_tokens
from kvplugin.compact import compact_in_place, compact_into, cpu_cache_views
from kvplugin.config import ENV_VAR, CompactionConfig, CompactionConfigError


def test_kept_tokens() -> None:
    cfg = CompactionConfig(enabled=True, trigger_tokens=1000, budget=0.5, window=32, sinks=4)
    assert cfg.kept_tokens(1000) == 1000  # not longer than the trigger
    assert cfg.kept_tokens(1001) == 501  # ceil(0.5 * 1001)
    assert CompactionConfig(enabled=True, trigger_tokens=10, budget=512).kept_tokens(4000) == 512
    assert CompactionConfig(enabled=True, trigger_tokens=10, budget=0.01).kept_tokens(100) == 36
    assert CompactionConfig(enabled=False, trigger_tokens=10).kept_tokens(4000) == 4000


def test_env_round_trip_and_errors() -> None:
    cfg = CompactionConfig(enabled=True, trigger_tokens=300, budget=200, per_head=True)
    assert CompactionConfig.from_env({ENV_VAR: cfg.to_env()}) == cfg
    assert CompactionConfig.from_env({}) == CompactionConfig()
    watermark = CompactionConfig(enabled=True, trigger="watermark", high_watermark=0.8)
    assert CompactionConfig.from_env({ENV_VAR: watermark.to_env()}) == watermark
    for bad in ('{"budget": 0}', '{"budget": 2.5}', '{"budget": 10}', '{"nope": 1}', "[1]", "{",
                '{"trigger": "usage"}', '{"high_watermark": 1.2}', '{"low_watermark": 0}',
                '{"high_watermark": 0.6, "low_watermark": 0.6}'):  # fmt: skip
        with pytest.raises(CompactionConfigError):
            CompactionConfig.from_env({ENV_VAR: bad})


def cpu_layout_cache(blocks: int, heads: int, block_size: int, dim: int) -> torch.Tensor:
    """A random cache in vLLM's CPU layout: per (block, head) keys as [dim, block_size], then
    values as [block_size, dim], in a [blocks, heads, block_size, 2 * dim] tensor."""
    return torch.randn(blocks, heads, block_size, 2 * dim)


def key_of(cache: torch.Tensor, block: int, head: int, slot: int) -> torch.Tensor:
    bs, dim = cache.shape[2], cache.shape[3] // 2
    return cache[block, head].reshape(-1)[: bs * dim].view(dim, bs)[:, slot]


def value_of(cache: torch.Tensor, block: int, head: int, slot: int) -> torch.Tensor:
    bs, dim = cache.shape[2], cache.shape[3] // 2
    return cache[block, head].reshape(-1)[bs * dim :].view(bs, dim)[slot]


def test_views_address_the_cpu_layout() -> None:
    cache = cpu_layout_cache(5, 2, 32, 64)
    keys, values = cpu_cache_views(cache)
    assert keys.shape == values.shape == (2, 5, 32, 2, 64)
    for block, head, slot in ((0, 0, 0), (3, 1, 17), (4, 0, 31)):
        assert torch.equal(keys[0, block, slot, head], key_of(cache, block, head, slot))
        assert torch.equal(keys[1, block, slot, head], key_of(cache, block, head, slot))
        assert torch.equal(values[0, block, slot, head], value_of(cache, block, head, slot))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("q_heads", [4, 14])  # GQA 2:1 (the tiny Llama), 7:1 (Qwen2.5-0.5B)
def test_compaction_in_the_cpu_layout(per_head: bool, q_heads: int) -> None:
    torch.manual_seed(0)
    layers = [cpu_layout_cache(8, 2, 32, 64) for _ in range(3)]
    before = [c.clone() for c in layers]
    views = [cpu_cache_views(c) for c in layers]
    table = torch.tensor([6, 2, 7, 0, 5], dtype=torch.int32)  # 150 tokens in 5 blocks
    cfg = CompactionConfig(
        enabled=True, trigger_tokens=100, budget=70, window=8, sinks=4, per_head=per_head
    )
    queries = torch.randn(3, 8, q_heads, 64)
    # the selection the loop-written reference makes, each KV head scored by its query group
    scores = score_tokens_reference([k for k, _ in views], KVLayout.FLASH, table, 150, queries)
    expected = select_tokens(pool_scores(scores), 70, sinks=4, window=8, per_head=per_head)
    result = compact_in_place(
        [k for k, _ in views], table, 150, queries, cfg.kept_tokens(150), cfg,
        value_caches=[v for _, v in views],
    )  # fmt: skip
    assert torch.equal(result.kept, expected)
    assert result.new_length == 70 and result.freed_blocks == [0, 5]
    heads = 2 if per_head else 1
    assert result.kept.shape == (3, heads, 70)
    for layer in range(3):
        for h in range(2):
            row = result.positions[layer, h if per_head else 0]
            assert sorted(row.tolist()) == result.kept[layer, h if per_head else 0].tolist()
            assert set(range(4)) | set(range(142, 150)) <= set(row.tolist())  # sinks, window
            for slot, src in enumerate(row.tolist()):
                args = (h, slot % 32)
                dst_block, src_block = int(table[slot // 32]), int(table[src // 32])
                assert torch.equal(key_of(layers[layer], dst_block, *args),
                                   key_of(before[layer], src_block, h, src % 32))  # fmt: skip
                assert torch.equal(value_of(layers[layer], dst_block, *args),
                                   value_of(before[layer], src_block, h, src % 32))  # fmt: skip


def test_tokens_decoded_after_the_prompt_are_kept() -> None:
    """The watermark trigger compacts a running request: its prompt (120 tokens) is scored
    and cut to 60, the 30 tokens decoded since stay, and the 150 cached tokens fit in 3 of
    its 5 blocks."""
    torch.manual_seed(1)
    layers = [cpu_layout_cache(8, 2, 32, 64) for _ in range(2)]
    before = [c.clone() for c in layers]
    views = [cpu_cache_views(c) for c in layers]
    table = torch.tensor([3, 7, 1, 4, 6], dtype=torch.int32)
    cfg = CompactionConfig(enabled=True, trigger_tokens=100, budget=60, window=8, sinks=4)
    result = compact_in_place(
        [k for k, _ in views], table, 120, torch.randn(2, 8, 4, 64), 60, cfg,
        value_caches=[v for _, v in views], length=150,
    )  # fmt: skip
    assert result.new_length == 90 and result.freed_blocks == [4, 6]
    assert result.kept.shape == (2, 1, 60) and int(result.kept.max()) < 120
    for layer in range(2):
        row = result.positions[layer, 0].tolist()
        assert sorted(row) == result.kept[layer, 0].tolist() + list(range(120, 150))
        for slot, src in enumerate(row):
            dst_block, src_block = int(table[slot // 32]), int(table[src // 32])
            for h in range(2):
                assert torch.equal(key_of(layers[layer], dst_block, h, slot % 32),
                                   key_of(before[layer], src_block, h, src % 32))  # fmt: skip
    with pytest.raises(ValueError, match="fewer than"):
        compact_in_place([k for k, _ in views], table, 120, torch.randn(2, 8, 4, 64), 60, cfg,
                         length=100)  # fmt: skip


def test_shared_blocks_are_gathered_in_order_and_left_alone() -> None:
    """compact_into: the same selection as in place, copied in order into fresh blocks (the
    decoded tail after it); the old blocks, shared with another reader, are not written."""
    torch.manual_seed(2)
    layers = [cpu_layout_cache(10, 2, 32, 64) for _ in range(2)]
    before = [c.clone() for c in layers]
    views = [cpu_cache_views(c) for c in layers]
    table, fresh = torch.tensor([3, 7, 1, 4], dtype=torch.int32), torch.tensor([9, 0, 5])
    cfg = CompactionConfig(enabled=True, trigger_tokens=50, budget=60, window=8, sinks=4)
    queries = torch.randn(2, 8, 4, 64)
    args = ([k for k, _ in views], table, 100, queries, 60, cfg)
    result = compact_into(*args, fresh, value_caches=[v for _, v in views], length=110)
    assert result.new_length == 70 and result.freed_blocks == [3, 7, 1, 4]
    for layer in range(2):
        order = result.kept[layer, 0].tolist() + list(range(100, 110))
        assert result.positions[layer, 0].tolist() == order
        for slot, src in enumerate(order):
            dst_block, src_block = int(fresh[slot // 32]), int(table[src // 32])
            for h in range(2):
                assert torch.equal(key_of(layers[layer], dst_block, h, slot % 32),
                                   key_of(before[layer], src_block, h, src % 32))  # fmt: skip
                assert torch.equal(value_of(layers[layer], dst_block, h, slot % 32),
                                   value_of(before[layer], src_block, h, src % 32))  # fmt: skip
        for block in table.tolist():
            assert torch.equal(layers[layer][block], before[layer][block])
    # the same tokens as in place
    in_place = compact_in_place(*args, value_caches=[v for _, v in views], length=110)
    assert torch.equal(in_place.kept, result.kept)
