"""KV-cache compaction kernels: effective bandwidth, and speedup over plain torch.

    python -m bench.kv_compaction [--quick]

On a GPU: realistic shapes (32 layers, 8 KV heads, head dim 128, block size 16, bf16) at
8k-128k tokens with 50-90% evicted. It measures a plain device-to-device copy in the same
run as the bandwidth ceiling, then for each case:

* ``gather``: the order-preserving copy of the kept tokens into fresh blocks, Triton kernel
  vs the torch index-based copy (one advanced-indexing copy per layer);
* ``move``: the in-place "fill holes from the tail" moves, same comparison;
* ``score``: the two-pass SnapKV scoring kernel (window 32, 32 query heads) vs vectorized
  torch (the CPU path).

Bandwidth counts the bytes each copy must read and write (2 x kept rows x row bytes). On a
machine without a GPU it runs small shapes with the torch CPU path against the obvious-loop
references and says so: those are not GPU figures. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from kernels import KVLayout, apply_moves, attention_scores, copy_tokens, plan_in_place
from kernels.compaction import Backend
from kernels.reference import copy_tokens_reference, score_tokens_reference


def timed(fn: Callable[[], object], device: str, reps: int) -> float:
    """Median seconds per call."""
    if device == "cuda":
        import triton.testing

        return (
            float(
                triton.testing.do_bench(fn, warmup=5, rep=max(20, reps * 5), return_mode="median")
            )
            / 1000
        )
    fn()
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def copy_bandwidth(device: str, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, 5)
    return 2 * nbytes / seconds / 1e9


def case(
    layers: int,
    heads: int,
    dim: int,
    block_size: int,
    tokens: int,
    evict: float,
    device: str,
    dtype: torch.dtype,
):
    blocks = -(-tokens // block_size)
    g = torch.Generator(device="cpu").manual_seed(tokens)
    caches = [
        torch.empty(2, blocks * 2, block_size, heads, dim, dtype=dtype, device=device)
        for _ in range(layers)
    ]
    for c in caches:
        c.normal_()
    table = torch.arange(blocks, dtype=torch.int32, device=device)
    keep_n = int(tokens * (1 - evict))
    keep = torch.sort(torch.randperm(tokens, generator=g)[:keep_n]).values.to(device)
    dst_table = torch.arange(
        blocks, blocks + -(-keep_n // block_size), dtype=torch.int32, device=device
    )
    mask = torch.zeros(1, 1, tokens, dtype=torch.bool, device=device)
    mask[0, 0, keep] = True
    return caches, table, keep, dst_table, mask.expand(layers, heads, tokens)


def run_case(args: argparse.Namespace, device: str, shapes: dict[str, int], dtype: torch.dtype,
             tokens: int, evict: float) -> dict[str, object]:  # fmt: skip
    layers, heads, dim, bs = shapes["layers"], shapes["heads"], shapes["dim"], shapes["block_size"]
    row_bytes = dim * torch.tensor([], dtype=dtype).element_size()
    fast: Backend = "triton" if device == "cuda" else "torch"
    caches, table, keep, dst_table, mask = case(
        layers, heads, dim, bs, tokens, evict, device, dtype
    )
    slots = torch.arange(keep.numel(), device=device)
    kept = keep.numel()
    plan = plan_in_place(mask, table, bs)

    def gather(backend: Backend) -> None:
        copy_tokens(caches, KVLayout.FLASH, table, dst_table, keep, slots, backend)

    def gather_reference() -> None:
        rows = (layers, heads, -1)
        copy_tokens_reference(
            caches, KVLayout.FLASH, table, dst_table, keep.expand(*rows), slots.expand(*rows)
        )

    def move(backend: Backend) -> None:
        apply_moves(caches, KVLayout.FLASH, table, plan, backend)

    on_gpu = device == "cuda"
    t_gather = timed(lambda: gather(fast), device, args.reps)
    t_gather_base = timed(
        (lambda: gather("torch")) if on_gpu else gather_reference,
        device,
        args.reps if on_gpu else 1,
    )
    moved = int((plan.src[0, 0] >= 0).sum())
    t_move = timed(lambda: move(fast), device, args.reps) if moved else float("nan")
    t_move_base = (
        timed(lambda: move("torch"), device, args.reps) if moved and on_gpu else float("nan")
    )
    gather_bytes = 2 * kept * 2 * heads * layers * row_bytes  # read + write, K and V
    move_bytes = 2 * moved * 2 * heads * layers * row_bytes
    row: dict[str, object] = {
        "tokens": tokens, "evicted": evict, "kept": kept, "moves": moved,
        "gather_ms": t_gather * 1e3, "gather_baseline_ms": t_gather_base * 1e3,
        "gather_gbs": gather_bytes / t_gather / 1e9, "gather_speedup": t_gather_base / t_gather,
        "move_ms": t_move * 1e3, "move_gbs": move_bytes / t_move / 1e9 if moved else float("nan"),
        "move_speedup": t_move_base / t_move if moved else float("nan"),
    }  # fmt: skip
    print(
        f"{tokens:>7} tokens, {evict:.0%} evicted: gather {t_gather * 1e3:.3f} ms "
        f"({row['gather_gbs']:.1f} GB/s, {row['gather_speedup']:.1f}x vs baseline), "
        f"move {t_move * 1e3:.3f} ms ({row['move_gbs']:.1f} GB/s) for {moved} moves",
        flush=True,
    )
    return row


def bench_copies(
    args: argparse.Namespace, device: str, shapes: dict[str, int], dtype: torch.dtype
) -> list[dict[str, object]]:
    rows = []
    for tokens in shapes["contexts"]:
        for evict in shapes["evictions"]:
            rows.append(run_case(args, device, shapes, dtype, tokens, evict))
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def bench_scoring(
    args: argparse.Namespace, device: str, shapes: dict[str, int], dtype: torch.dtype
) -> dict[str, float]:
    layers, heads, dim, bs = shapes["layers"], shapes["heads"], shapes["dim"], shapes["block_size"]
    tokens, window, q_heads = shapes["score_tokens"], 32, shapes["q_heads"]
    caches, table, *_ = case(layers, heads, dim, bs, tokens, 0.5, device, dtype)
    queries = torch.randn(layers, window, q_heads, dim, device=device, dtype=dtype)
    if device == "cuda":
        t_kernel = timed(
            lambda: attention_scores(caches, KVLayout.FLASH, table, tokens, queries, "triton"),
            device,
            args.reps,
        )
        t_base = timed(
            lambda: attention_scores(caches, KVLayout.FLASH, table, tokens, queries, "torch"),
            device,
            args.reps,
        )
    else:
        t_kernel = timed(
            lambda: attention_scores(caches, KVLayout.FLASH, table, tokens, queries, "torch"),
            device,
            args.reps,
        )
        t_base = timed(
            lambda: score_tokens_reference(caches, KVLayout.FLASH, table, tokens, queries),
            device,
            1,
        )
    print(
        f"scoring {tokens} tokens x {layers} layers: {t_kernel * 1e3:.3f} ms vs {t_base * 1e3:.3f} ms baseline",
        flush=True,
    )
    return {
        "score_tokens": tokens,
        "score_ms": t_kernel * 1e3,
        "score_baseline_ms": t_base * 1e3,
        "score_speedup": t_base / t_kernel,
    }


def _finite(value: object) -> object:
    """JSON has no NaN: figures that do not apply become null."""
    if isinstance(value, float):
        return None if value != value else round(value, 4)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer cases")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    dtype = torch.bfloat16
    if gpu:
        shapes = {"layers": 32, "heads": 8, "dim": 128, "block_size": 16, "q_heads": 32,
                  "contexts": [8192, 32768, 131072] if not args.quick else [32768],
                  "evictions": [0.5, 0.9] if not args.quick else [0.7], "score_tokens": 32768}  # fmt: skip
        name = torch.cuda.get_device_name()
    else:
        shapes = {"layers": 4, "heads": 2, "dim": 64, "block_size": 16, "q_heads": 8,
                  "contexts": [1024], "evictions": [0.5, 0.9], "score_tokens": 256}  # fmt: skip
        name = "cpu (small shapes; torch CPU path vs obvious-loop references: NOT GPU figures)"
    ceiling = copy_bandwidth(device, (2 << 30) if gpu else (256 << 20))
    print(f"device: {name}; plain copy: {ceiling:.1f} GB/s", flush=True)
    rows = bench_copies(args, device, shapes, dtype)
    scoring = bench_scoring(args, device, shapes, dtype)
    headline = max(rows, key=lambda r: (r["tokens"], -float(r["evicted"])))  # type: ignore[arg-type]
    result = {
        "device": name,
        "copy_bandwidth_gbs": round(ceiling, 1),
        "bandwidth_fraction": round(float(headline["gather_gbs"]) / ceiling, 3),  # type: ignore[arg-type]
        "speedup_vs_torch": round(float(headline["gather_speedup"]), 2),  # type: ignore[arg-type]
        "move_bandwidth_fraction": round(float(headline["move_gbs"]) / ceiling, 3),  # type: ignore[arg-type]
        "scoring_speedup_vs_torch": round(scoring["score_speedup"], 2),
        "headline_case": {"tokens": headline["tokens"], "evicted": headline["evicted"]},
        "cases": rows,
        "scoring": scoring,
    }
    print(json.dumps(_finite(result)))


if __name__ == "__main__":
    main()
