"""``bench.kv_session --model PATH``: KV compaction's accuracy with a model that reads.

One vLLM server (no gateway; float32) for the model in ``PATH``, started once with compaction
off and once per budget with the prompt trigger, in turn, with the same questions: ``--docs``
agent-like histories (``--lines`` lines, +10 and +20 for the second and third of every three;
~26 Qwen tokens a line, so 165 lines are ~4.4k tokens), each with ``--facts`` numbers planted
at evenly spread depths, then one request per fact asking for it. A fact's position is the
third of the history it sits in (early, middle, late).

Off, the questions of one history share its prefix in vLLM's prefix cache. On, a compacted
request's own blocks leave that cache (they no longer hold what their hashes say), so each
question would be computed whole: too slow on a shared CPU. Instead, while a history's
questions are asked, one request holds its first ``trigger_tokens`` tokens (not compacted:
not longer than the trigger) and decodes; its blocks are shared, so the plugin scores each
question on its whole cache as always, gathers the ``budget`` kept into fresh blocks, and
leaves the prefix cached (the plugin's shared-block path, tests/kvplugin/test_engine.py).
What the model then reads is the same compacted cache as in place. vLLM's
``kv_transfer_params`` record says how many tokens each kept.

The last line is JSON: ``accuracy_vs_full_cache`` (right answers on / off, at the first
budget) with a paired bootstrap 95% interval over the questions, accuracies per position
with Wilson 95% intervals, and ``concurrency_ratio`` (KV blocks held after the prefill, off /
on, summed over the questions).
"""

from __future__ import annotations

import math
import random
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backends.vllm_server import VllmServerSpec, command, environment
from bench.kv_session import PeakUsage, history
from bench.procs import start, stop, wait_http
from bench.stack import free_port
from kvplugin.config import CompactionConfig

NAMES = [
    "amber", "birch", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
    "kestrel", "lumen", "marble", "nectar", "onyx", "pewter", "quartz", "raven", "sable", "tundra",
    "umber", "violet", "willow", "yarrow",
]  # fmt: skip
POSITIONS = ("early", "middle", "late")


@dataclass(frozen=True)
class Question:
    doc: int
    prompt: str
    expected: str
    where: str  # early, middle, late: the third of the history the fact sits in


def questions(docs: int, facts: int, lines: int, seed: int = 2026) -> list[Question]:
    """``facts`` questions on each of ``docs`` histories of ``lines`` lines (deterministic)."""
    rng = random.Random(seed)
    out = []
    for d in range(docs):
        length = lines + 10 * (d % 3)  # ~26 Qwen tokens a line: 165 lines ~4.4k tokens
        text = history(d * 10 + 3, length)
        names = rng.sample(NAMES, facts)
        values = [str(rng.randrange(1000, 10000)) for _ in range(facts)]
        # depths (1/2 + k) / facts of the history: every third holds facts // 3 of them
        depths = [int((k + 0.5) * length / facts) for k in range(facts)]
        for k in reversed(range(facts)):  # from the end, so earlier indices stay valid
            text.insert(depths[k], f"NOTE: the access code of vault {names[k]} is {values[k]}.")
        body = "\n".join(text)
        for k in range(facts):
            where = POSITIONS[min(3 * depths[k] // length, 2)]
            # the vault's name first: the questions of a history differ from their first
            # token on, so each computes >= window (32) tokens past the prefix it shares
            # with the last one (the plugin needs the window's queries)
            ask = (f"\n\nVault {names[k]}. Question: in the history above, what is the access "
                   f"code of vault {names[k]}? Answer with the access code's number only, "
                   "with no other words.")  # fmt: skip
            out.append(Question(d, body + ask, values[k], where))
    return out


@contextmanager
def reader_server(
    model: Path, compaction: CompactionConfig | None, max_model_len: int, kv_bytes: int
) -> Iterator[str]:
    """A vLLM server for ``model`` (the plugin's scheduler when ``compaction`` is on), in
    float32: on CPUs without AVX-512 BF16 (AVX2 only here) bf16 matmuls are the slow path."""
    spec = VllmServerSpec(
        name="reader", model_dir=model, served_model_name="reader", port=free_port(),
        max_model_len=max_model_len, kv_cache_bytes=kv_bytes, kv_compaction=compaction,
        dtype="float32",
    )  # fmt: skip
    python = Path.home() / ".cache/gearshift/vllm-venv/bin/python"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "vllm.log"
        proc: subprocess.Popen[bytes] = start(command(spec, python), log, environment(spec, {}))
        try:
            wait_http(spec.base_url + "/health", proc, log, timeout_s=900)
            yield spec.base_url
        except Exception:
            print(f"vLLM's log ends:\n{log.read_text(errors='replace')[-3000:]}", flush=True)
            raise
        finally:
            stop(proc)


@contextmanager
def holding(url: str, prompt: str, tokens: int, max_tokens: int) -> Iterator[None]:
    """A request on the first ``tokens`` tokens of ``prompt``'s chat prompt, decoding until
    the block ends: while it runs its blocks are shared (``ref_cnt > 1``), so the plugin
    gathers each question's kept tokens into fresh blocks and leaves the prefix cached for
    the next question, which then computes only its tail (the plugin's shared-block path)."""
    with httpx.Client(base_url=url, timeout=1800) as client:
        ids = client.post("/tokenize", json={
            "model": "reader", "messages": [{"role": "user", "content": prompt}],
        }).json()["tokens"][:tokens]  # fmt: skip
        prefilled, done = threading.Event(), threading.Event()

        def run() -> None:
            try:
                with client.stream("POST", "/v1/completions", json={
                    "model": "reader", "prompt": ids, "max_tokens": max_tokens,
                    "ignore_eos": True, "temperature": 0, "stream": True,
                }) as r:  # fmt: skip
                    for _ in r.iter_lines():  # closing the stream aborts the request
                        prefilled.set()
                        if done.is_set():
                            break
            finally:  # ended or failed: never leave the questions waiting
                prefilled.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        while not prefilled.wait(1.0):  # in steps, so Ctrl-C gets through
            pass
        try:
            yield
        finally:
            done.set()
            thread.join()


def ask_all(url: str, qs: Sequence[Question], hold_tokens: int | None = None) -> dict[str, Any]:
    """Each question in turn; per question its prompt and kept tokens and whether it is right.
    ``hold_tokens``: the questions of a history are asked while a request holds its first
    ``hold_tokens`` tokens (``holding``; at most the trigger, so it is not compacted)."""
    rows = []
    with httpx.Client(base_url=url, timeout=1800) as client, PeakUsage(url) as usage:
        for doc in sorted({q.doc for q in qs}):
            mine = [q for q in qs if q.doc == doc]
            held = (
                holding(url, mine[0].prompt, hold_tokens, max_tokens=2048)
                if hold_tokens
                else nullcontext()
            )
            with held:
                rows += [ask(client, q) for q in mine]
    return {"rows": rows, "block_size": usage.block_size or 128}


def ask(client: httpx.Client, q: Question) -> dict[str, Any]:
    started = time.perf_counter()
    r = client.post("/v1/chat/completions", json={
        "model": "reader", "messages": [{"role": "user", "content": q.prompt}],
        "max_tokens": 8, "temperature": 0,
    })  # fmt: skip
    r.raise_for_status()
    data = r.json()
    prompt = int(data["usage"]["prompt_tokens"])
    record = (data.get("kv_transfer_params") or {}).get("gearshift_kv_compaction") or {}
    answer = data["choices"][0]["message"]["content"] or ""
    row = {
        "prompt_tokens": prompt, "kept_tokens": int(record.get("kept_tokens", prompt)),
        "correct": q.expected in answer, "where": q.where,
        "seconds": round(time.perf_counter() - started, 2),
    }  # fmt: skip
    print(f"  doc {q.doc} {q.where}: {prompt} tokens, kept {row['kept_tokens']}, "
          f"{row['seconds']} s, {'right' if row['correct'] else 'wrong'}: {answer!r}", flush=True)  # fmt: skip
    return row


def wilson(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3))


def bootstrap_ratio(
    off: Sequence[bool], on: Sequence[bool], reps: int = 4000, seed: int = 0
) -> tuple[float, float] | None:
    """Paired bootstrap 95% interval of sum(on) / sum(off), resampling questions."""
    rng, n, ratios = random.Random(seed), len(off), []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        base = sum(off[i] for i in idx)
        if base:
            ratios.append(sum(on[i] for i in idx) / base)
    if not ratios:
        return None
    ratios.sort()
    return (round(ratios[int(0.025 * len(ratios))], 3), round(ratios[int(0.975 * len(ratios))], 3))


def summarize(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """Accuracy on / off (paired interval), per position, and KV blocks held off / on."""
    a, b, block = off["rows"], on["rows"], on["block_size"]
    right_off, right_on = [r["correct"] for r in a], [r["correct"] for r in b]
    by_position = {}
    for where in POSITIONS:
        idx = [i for i, r in enumerate(a) if r["where"] == where]
        n, ro, rn = len(idx), sum(right_off[i] for i in idx), sum(right_on[i] for i in idx)
        by_position[where] = {"n": n, "off": ro, "on": rn, "off_ci": wilson(ro, n),
                              "on_ci": wilson(rn, n)}  # fmt: skip

    def blocks(rows: list[dict[str, Any]], key: str) -> int:
        return sum(math.ceil(r[key] / block) for r in rows)

    held_off, held_on = blocks(a, "prompt_tokens"), blocks(b, "kept_tokens")
    ratio = round(sum(right_on) / sum(right_off), 3) if any(right_off) else None
    compacted = sum(r["kept_tokens"] < r["prompt_tokens"] for r in b)
    tokens = [r["prompt_tokens"] for r in a]
    return {
        "questions": len(a),
        "accuracy_full_cache": round(sum(right_off) / len(a), 3),
        "accuracy_compacted": round(sum(right_on) / len(b), 3),
        "accuracy_full_cache_ci": wilson(sum(right_off), len(a)),
        "accuracy_compacted_ci": wilson(sum(right_on), len(b)),
        "accuracy_vs_full_cache": ratio,
        "accuracy_vs_full_cache_ci": bootstrap_ratio(right_off, right_on),
        "agreement": round(
            sum(x == y for x, y in zip(right_off, right_on, strict=True)) / len(a), 3
        ),
        "by_position": by_position,
        "compacted": compacted,  # questions whose cache was compacted (all, unless misconfigured)
        "concurrency_ratio": round(held_off / held_on, 3),
        "kv_blocks_held_off": held_off,
        "kv_blocks_held_on": held_on,
        "prompt_tokens_min_max": [min(tokens), max(tokens)],
        "seconds_per_question_off": round(sum(r["seconds"] for r in a) / len(a), 2),
        "seconds_per_question_on": round(sum(r["seconds"] for r in b) / len(b), 2),
        "block_size": block,
    }


def main(
    model: Path,
    budgets: Sequence[float],
    qs: Sequence[Question],
    trigger_tokens: int,
    hold: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per-run rows, summary): off, then each budget in turn (``hold``: each history's
    questions asked while a request holds its first ``trigger_tokens`` tokens)."""
    longest = max(len(q.prompt) for q in qs) // 2 + 256  # >= tokens: ~2.5+ chars a token here
    max_len = 1 << max(12, math.ceil(math.log2(longest)))
    kv_bytes = 4 * max_len * 24 * 1024  # 4 prompts at 24 KiB a token (Qwen2.5-0.5B, fp32)
    runs: dict[str, Any] = {}
    print(f"compaction off: {len(qs)} questions, max_model_len {max_len}", flush=True)
    with reader_server(model, None, max_len, kv_bytes) as url:
        runs["off"] = ask_all(url, qs)
    for budget in budgets:
        cfg = CompactionConfig(enabled=True, trigger_tokens=trigger_tokens, budget=budget)
        print(f"compaction on, budget {budget}", flush=True)
        with reader_server(model, cfg, max_len, kv_bytes) as url:
            runs[f"on_{budget}"] = ask_all(url, qs, hold_tokens=trigger_tokens if hold else None)
    per_budget = {b: summarize(runs["off"], runs[f"on_{b}"]) for b in budgets}
    first = per_budget[budgets[0]]
    summary = {
        "model": model.name, "budget": budgets[0], **first,
        "decode_speedup": None,  # not measured here: bench.kv_session --trigger admission
        "other_budgets": {str(b): per_budget[b] for b in budgets[1:]},
    }  # fmt: skip
    return runs, summary
