"""A long agent session on the real embedded stack, KV compaction off vs on, in one run.

``python -m bench.kv_session`` starts ``gearshift serve`` twice, one after the other (the
full tier without compaction, then with ``embedded.kv_compaction.full`` at ``--budget``),
and runs the same session on each: an agent's growing history of tool outputs, logs and
code, with facts planted early, in the middle and late in it; every step appends more
history and asks about one of the facts (a number the answer must contain). Per step: the
time to answer, the prompt's tokens, what the engine kept (kvplugin's record, which the
gateway takes out of the answer and records with the step: ``kv_compaction_kept_tokens``
of ``GET /v1/steps/{id}``), whether the answer is right; per run: the KV
pool's peak use sampled from vLLM's ``/metrics``. The last line is JSON with
``accuracy_vs_full_cache`` (right answers on / off), ``concurrency_ratio`` (KV blocks a
request holds after its prefill, off / on: how many more such requests a fixed pool holds
at once, from the blocks, not from a concurrent run) and ``time_ratio`` (time per step,
on / off).

``--trigger watermark`` runs concurrent sessions in a KV pool too small for them all,
compaction off vs the watermark trigger (``bench.kv_pressure``); ``--trigger admission``
sends ``--sessions`` long requests with long decodes at once into a pool that holds about
two, off vs the prompt trigger, and measures how many run at once (``bench.kv_admission``).

``--model PATH`` measures the accuracy with a model that reads (e.g. Qwen2.5-Coder-0.5B):
one vLLM server, off vs each ``--budget``, many questions (``bench.kv_reader``).

``--on URL --off URL`` (gateway URLs) with ``--on-engine``/``--off-engine`` (the full
tier's vLLM server) run the session on stacks already serving, as the end-to-end test's
``--quick`` run does. Compacted blocks never enter the prefix cache, so with compaction on
each step's prompt is computed whole again: that cost is part of ``time_ratio``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.stack import serve

FACTS = [("build id of service alpha", "4821"), ("port of the billing worker", "7309"),
         ("exit code of the nightly migration", "113")]  # fmt: skip


def history(step: int, lines: int) -> list[str]:
    """``lines`` lines of agent-like history for ``step`` (deterministic)."""
    out = []
    for i in range(lines):
        n = step * 1000 + i
        kind = n % 3
        if kind == 0:
            out.append(f"[tool:run_shell] exit=0 stdout: module_{n}.py {n * 37 % 9000} bytes ok")
        elif kind == 1:
            out.append(f"2026-12-01T10:{i % 60:02d}:00 INFO job-{step} step {i} in {n * 7 % 97} ms")
        else:
            out.append(f"def handler_{n}(x): return x * {n % 13} + {step}")
    return out


def session_prompts(steps: int, lines: int, last: int = len(FACTS)) -> list[tuple[str, str, str]]:
    """(user message, expected number, where the fact sits) per request: each step sends
    the history so far and asks about the early fact (the agent carrying on); the last
    step asks about each fact in turn (early: first step, middle, late: last step), or
    about the ``last`` first ones."""
    placed = {k: round(k * (steps - 1) / 2) for k in range(len(FACTS))}
    where = ("early", "middle", "late")
    text: list[str] = []
    prompts = []
    for step in range(steps):
        chunk = history(step, lines)
        for k, at in placed.items():
            if at == step:
                what, value = FACTS[k]
                chunk.insert(lines // 2, f"NOTE: the {what} is {value}.")
        text += chunk
        asked = range(last) if step == steps - 1 else (0,)
        for k in asked:
            what, value = FACTS[k]
            question = f"\n\nQuestion: what is the {what}? Answer with the number only."
            prompts.append(("\n".join(text) + question, value, where[k]))
    return prompts


@dataclass
class Step:
    seconds: float
    prompt_tokens: int
    kept_tokens: int
    correct: bool
    where: str


class PeakUsage:
    """Samples ``vllm:kv_cache_usage_perc`` from an engine's /metrics in the background."""

    def __init__(self, engine_url: str) -> None:
        self.url, self.peak, self._stop = engine_url + "/metrics", 0.0, threading.Event()
        self.block_size: int | None = None  # from vllm:cache_config_info
        self.num_blocks: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.25):
                try:
                    text = client.get(self.url).text
                except httpx.HTTPError:
                    continue
                for line in text.splitlines():
                    if line.startswith("vllm:kv_cache_usage_perc"):
                        self.peak = max(self.peak, float(line.rsplit(" ", 1)[1]))
                    elif line.startswith("vllm:cache_config_info{"):
                        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                        self.block_size = int(labels.get("block_size") or 0) or None
                        self.num_blocks = int(labels.get("num_gpu_blocks") or 0) or None

    def __enter__(self) -> PeakUsage:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def recorded_features(client: httpx.Client, step_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """The recorded step's features (the recorder writes in batches: wait for it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = client.get(f"/v1/steps/{step_id}")
        if r.status_code == 200:
            return dict(r.json().get("features") or {})
        if time.monotonic() > deadline:
            raise RuntimeError(f"step {step_id} not recorded after {timeout_s} s: {r.text[:300]}")
        time.sleep(0.2)


def run_session(
    url: str, engine_url: str, prompts: list[tuple[str, str, str]], last: int
) -> dict[str, Any]:
    steps: list[Step] = []
    with httpx.Client(base_url=url, timeout=1800) as client, PeakUsage(engine_url) as usage:
        for message, expected, where in prompts:
            started = time.perf_counter()
            r = client.post("/v1/chat/completions", json={
                "model": "full", "messages": [{"role": "user", "content": message}],
                "max_tokens": 12, "temperature": 0,
            })  # fmt: skip
            r.raise_for_status()
            data = r.json()
            prompt = int(data["usage"]["prompt_tokens"])
            features = recorded_features(client, r.headers["x-gearshift-step-id"])
            kept = int(features.get("kv_compaction_kept_tokens", prompt))
            answer = data["choices"][0]["message"]["content"] or ""
            steps.append(Step(
                time.perf_counter() - started, prompt, kept,
                expected in answer, where,
            ))  # fmt: skip
            print(f"  step {len(steps)}: {prompt} tokens, kept {steps[-1].kept_tokens}, "
                  f"{steps[-1].seconds:.1f} s, {'right' if steps[-1].correct else 'wrong'}: "
                  f"{answer!r}", flush=True)  # fmt: skip
    return {
        "seconds_per_step": sum(s.seconds for s in steps) / len(steps),
        "prompt_tokens": [s.prompt_tokens for s in steps],
        "kept_tokens": [s.kept_tokens for s in steps],
        "correct": sum(s.correct for s in steps),
        "steps": len(steps),
        # the last step's questions: is the fact found where it sits?
        "by_position": {s.where: s.correct for s in steps[-last:]},
        "peak_kv_usage": usage.peak,
        "block_size": usage.block_size,
        "pool_blocks": usage.num_blocks,
    }


def compare(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    block = on["block_size"] or off["block_size"] or 128  # vLLM's CPU default

    def blocks(tokens: list[int]) -> int:
        return sum(math.ceil(t / block) for t in tokens)

    return {
        "accuracy_full_cache": off["correct"] / off["steps"],
        "accuracy_compacted": on["correct"] / on["steps"],
        "accuracy_vs_full_cache": on["correct"] / off["correct"] if off["correct"] else None,
        "concurrency_ratio": blocks(off["kept_tokens"]) / blocks(on["kept_tokens"]),
        "time_ratio": on["seconds_per_step"] / off["seconds_per_step"],
        "seconds_per_step_off": round(off["seconds_per_step"], 2),
        "seconds_per_step_on": round(on["seconds_per_step"], 2),
        "peak_kv_usage_off": off["peak_kv_usage"],
        "peak_kv_usage_on": on["peak_kv_usage"],
        "prompt_tokens_last": off["prompt_tokens"][-1],
        "by_position_off": off["by_position"],
        "by_position_on": on["by_position"],
        "kv_blocks_held_off": blocks(off["kept_tokens"]),
        "kv_blocks_held_on": blocks(on["kept_tokens"]),
        "block_size": block,
    }


@contextmanager
def stack(compaction: dict[str, str]) -> Iterator[tuple[str, str]]:
    env = {"GEARSHIFT_STORE__ENABLED": "false", "GEARSHIFT_SANDBOX__ENABLED": "false"}
    env |= {
        f"GEARSHIFT_EMBEDDED__KV_COMPACTION__FULL__{k.upper()}": v for k, v in compaction.items()
    }
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp) / "serve.log", env) as s:
        yield s.url, s.full_url


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true",
        help="prompt: 2 short steps; watermark: 2 sessions, one round (two stack starts)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, help="default: 6 (prompt), 2 (watermark)")
    p.add_argument(
        "--lines", type=int, help="history lines added per step (~25 tokens each); default: "
        "40 (prompt), 10 (watermark: the first session's, the others more)",
    )  # fmt: skip
    p.add_argument("--budget", default="0.5")
    p.add_argument(
        "--trigger", choices=("prompt", "watermark", "admission"), default="prompt",
        help="prompt: one session, compacted after each prefill; watermark: concurrent "
        "sessions in a small KV pool (bench.kv_pressure); admission: long requests at once "
        "in a pool that holds about two, off vs the prompt trigger (bench.kv_admission)",
    )  # fmt: skip
    p.add_argument(
        "--trigger-tokens",
        type=int,
        help="compact prompts longer; default: 1024, 256 (watermark), 4096 (--model)",
    )
    p.add_argument("--on", help="gateway URL of a running stack with compaction on")
    p.add_argument("--on-engine", help="its full tier's vLLM server URL")
    p.add_argument("--off", help="gateway URL of a running stack with compaction off")
    p.add_argument("--off-engine", help="its full tier's vLLM server URL")
    r = p.add_argument_group("a model that reads (bench.kv_reader)")
    r.add_argument(
        "--model", type=Path, help="a model folder: one vLLM server, off vs each budget "
        "(--budget takes a comma list), many questions (bench.kv_reader)",
    )  # fmt: skip
    r.add_argument("--docs", type=int, default=4, help="histories, each its own prompts")
    r.add_argument(
        "--facts", type=int, default=12, help="facts per history (<= 24), one question each"
    )
    w = p.add_argument_group("watermark trigger")
    w.add_argument("--sessions", type=int, default=3, help="sessions running at once")
    w.add_argument("--pool-blocks", type=int, default=11, help="KV pool of the full tier")
    w.add_argument("--max-tokens", type=int, default=24, help="tokens decoded per step")
    w.add_argument("--rounds", type=int, default=2, help="off, on pairs, alternating")
    return p.parse_args(argv)


def main_admission(args: argparse.Namespace) -> None:
    from bench.kv_admission import main as admission
    from bench.kv_pressure import Shape

    if args.on or args.off:
        raise SystemExit("--trigger admission starts its own stacks (its KV pool is sized)")
    # quick: 3 requests of ~700 tokens (6 blocks) in 13 blocks: off runs 2 at once
    shape = Shape(
        sessions=3 if args.quick else args.sessions,
        steps=1,
        lines=22 if args.quick else args.lines or 40,
        pool_blocks=13 if args.quick else args.pool_blocks,
        max_tokens=32 if args.quick else args.max_tokens,
        trigger_tokens=256 if args.quick else args.trigger_tokens or 512,
        budget=args.budget,
    )
    rounds, result = admission(shape, 1 if args.quick else args.rounds)
    print(json.dumps({"rounds": rounds}))
    print(json.dumps(result))


def main_watermark(args: argparse.Namespace) -> None:
    from bench.kv_pressure import Shape
    from bench.kv_pressure import main as pressure

    if args.on or args.off:
        raise SystemExit("--trigger watermark starts its own stacks (its KV pool is sized)")
    shape = Shape(
        sessions=2 if args.quick else args.sessions,
        steps=2 if args.quick else args.steps or 2,
        lines=10 if args.quick else args.lines or 10,
        pool_blocks=10 if args.quick else args.pool_blocks,
        max_tokens=16 if args.quick else args.max_tokens,
        trigger_tokens=256 if args.quick else args.trigger_tokens or 256,
        budget=args.budget,
    )
    rounds, result = pressure(shape, 1 if args.quick else args.rounds)
    print(json.dumps({"rounds": rounds}))
    print(json.dumps(result))


def main_reader(args: argparse.Namespace) -> None:
    from bench.kv_reader import main as reader
    from bench.kv_reader import questions

    budgets = [float(b) for b in args.budget.split(",")]
    # quick: one ~3.2k-token history, 3 questions; else ~4.4k-5k tokens, compacted past 4096
    docs, facts, lines, trigger = (
        (1, 3, 120, 1024) if args.quick else (args.docs, args.facts, args.lines or 165, 4096)
    )
    qs = questions(docs, facts, lines)
    runs, summary = reader(args.model, budgets, qs, args.trigger_tokens or trigger)
    print(json.dumps(runs))
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    if args.model is not None:
        main_reader(args)
        return
    if args.trigger == "watermark":
        main_watermark(args)
        return
    if args.trigger == "admission":
        main_admission(args)
        return
    # quick: the last step asks about the early fact only (the prefill is the cost)
    steps, lines, last = (
        (2, 24, 1) if args.quick else (args.steps or 6, args.lines or 40, len(FACTS))
    )
    prompts = session_prompts(steps, lines, last)
    if args.on and args.off:
        print("compaction off (running stack)", flush=True)
        off = run_session(args.off, args.off_engine or args.off, prompts, last)
        print("compaction on (running stack)", flush=True)
        on = run_session(args.on, args.on_engine or args.on, prompts, last)
    else:
        print("compaction off: starting the stack", flush=True)
        with stack({"enabled": "false"}) as (url, engine):
            off = run_session(url, engine, prompts, last)
        print(f"compaction on (budget {args.budget}): starting the stack", flush=True)
        compaction = {
            "enabled": "true", "budget": args.budget,
            "trigger_tokens": str(args.trigger_tokens or 1024),
        }  # fmt: skip
        with stack(compaction) as (url, engine):
            on = run_session(url, engine, prompts, last)
    result = {"steps": steps, "budget": args.budget, **compare(off, on)}
    print(json.dumps({"off": off, "on": on}))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
