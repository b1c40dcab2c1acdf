"""``bench.kv_session --trigger watermark``: concurrent agent sessions in a KV pool too small
for all of them, KV compaction off vs the watermark trigger, alternating in one run.

Each round starts the embedded stack with ``embedded.kv_cache_bytes`` set to ``--pool-blocks``
blocks of the full tier's model (so the sessions' histories do not all fit), compaction off
or ``trigger: watermark`` on the full tier, and runs ``--sessions`` sessions at once through
the gateway: each appends history to its own conversation (its own facts, so no two sessions
share a prefix) and asks about its early fact at every step. Rounds alternate off, on, off,
on... (``--rounds`` of each). Per round: seconds per session step, completed sessions per
CPU-second of the stack's process tree (gateway and both vLLM servers), vLLM's preemptions
and the plugin's compactions (counter deltas from the full tier's ``/metrics``), right
answers; across rounds, how many of the on rounds' answers are the off rounds' answers.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.kv_session import FACTS, history
from bench.procs import tree_cpu_seconds
from bench.stack import serve

# one KV block of the full tier's model (SmolLM2-135M in bf16): 30 layers x 3 KV heads x
# head dim 64 x (K, V) x 2 bytes x 128 tokens (vLLM's CPU block size); the round checks the
# pool it got against vLLM's cache_config_info
BLOCK_TOKENS = 128
BLOCK_BYTES = 30 * 3 * 64 * 2 * 2 * BLOCK_TOKENS
COUNTERS = {
    "preemptions": "vllm:num_preemptions",
    "compactions": "gearshift_kv_compactions",
    "evicted_tokens": "gearshift_kv_compaction_evicted_tokens",
    "freed_blocks": "gearshift_kv_compaction_freed_blocks",
}


@dataclass(frozen=True, slots=True)
class Shape:
    sessions: int
    steps: int
    lines: int  # history lines added per step (~25 tokens each)
    pool_blocks: int
    max_tokens: int
    trigger_tokens: int
    budget: str


def session_messages(session: int, steps: int, lines: int) -> list[tuple[str, str]]:
    """(user message, expected number) per step of session ``session``: its history grows by
    ``lines * (2 + session) / 2`` lines a step (sessions of different lengths, as agents'
    are: the pool fills up to its top, not to a multiple of one request), with its fact
    planted in the first step; every step asks about it."""
    what, value = FACTS[session % len(FACTS)]
    value = f"{value}{session}"  # a different number per session
    lines = lines * (2 + session) // 2
    text: list[str] = []
    out = []
    for step in range(steps):
        chunk = history(session * 100 + step, lines)
        if step == 0:
            chunk.insert(lines // 2, f"NOTE: the {what} is {value}.")
        text += chunk
        question = f"\n\nQuestion: what is the {what}? Answer with the number only."
        out.append(("\n".join(text) + question, value))
    return out


def read_counters(text: str) -> dict[str, float]:
    """The counters of ``COUNTERS`` in a /metrics text, summed over their labels."""
    names = {v: k for k, v in COUNTERS.items()}
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in names:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[names[family.name]] += float(sample.value)
    return out


def read_pool_blocks(text: str) -> int | None:
    """The KV pool's blocks, as vLLM's ``cache_config_info`` in a /metrics text says."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return int(sample.labels.get("num_gpu_blocks") or 0) or None
    return None


def metrics(engine_url: str) -> str:
    return httpx.get(engine_url + "/metrics", timeout=30).text


def run_sessions(url: str, shape: Shape) -> tuple[list[list[str]], list[float], int]:
    """Every session at once; (answers per session, seconds per step, right answers)."""
    answers: list[list[str]] = [[] for _ in range(shape.sessions)]
    seconds: list[float] = []
    right = 0
    lock = threading.Lock()

    def session(k: int) -> None:
        nonlocal right
        with httpx.Client(base_url=url, timeout=1800) as client:
            for message, expected in session_messages(k, shape.steps, shape.lines):
                started = time.perf_counter()
                r = client.post("/v1/chat/completions", json={
                    "model": "full", "messages": [{"role": "user", "content": message}],
                    "max_tokens": shape.max_tokens, "temperature": 0,
                    # an agent's step decodes a tool call or an answer of some length: the
                    # decode grows the cache, which is what preempts under pressure
                    "ignore_eos": True,
                })  # fmt: skip
                r.raise_for_status()
                answer = r.json()["choices"][0]["message"]["content"] or ""
                with lock:
                    seconds.append(time.perf_counter() - started)
                    answers[k].append(answer)
                    right += expected in answer

    with ThreadPoolExecutor(shape.sessions) as pool:
        list(pool.map(session, range(shape.sessions)))
    return answers, seconds, right


@contextmanager
def pressure_stack(shape: Shape, trigger: str | None) -> Iterator[tuple[str, str, int]]:
    """The stack with the full tier's pool at ``shape.pool_blocks`` blocks, compaction off
    (``trigger`` None) or on with that trigger (``watermark`` or ``prompt``)."""
    env = {
        "GEARSHIFT_STORE__ENABLED": "false",
        "GEARSHIFT_SANDBOX__ENABLED": "false",
        # requests wait in vLLM's queue for room in the pool: on a loaded machine longer than
        # the gateway's 300 s for a whole non-streamed answer
        "GEARSHIFT_TIMEOUTS__FIRST_BYTE_S": "1800",
        # + 1: vLLM keeps one block of the pool aside (its null block)
        "GEARSHIFT_EMBEDDED__KV_CACHE_BYTES": str((shape.pool_blocks + 1) * BLOCK_BYTES),
        # vLLM refuses a pool that cannot hold one request of max_model_len
        "GEARSHIFT_EMBEDDED__MAX_MODEL_LEN": str(max(256, shape.pool_blocks * BLOCK_TOKENS)),
        "GEARSHIFT_EMBEDDED__KV_COMPACTION__FULL__ENABLED": str(trigger is not None).lower(),
    }
    if trigger is not None:
        prefix = "GEARSHIFT_EMBEDDED__KV_COMPACTION__FULL__"
        env |= {
            prefix + "TRIGGER": trigger,
            prefix + "TRIGGER_TOKENS": str(shape.trigger_tokens),
            prefix + "BUDGET": shape.budget,
        }
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp) / "serve.log", env) as s:
        yield s.url, s.full_url, s.pid


def run_round(shape: Shape, watermark: bool) -> dict[str, Any]:
    with pressure_stack(shape, "watermark" if watermark else None) as (url, engine, pid):
        before = read_counters(metrics(engine))
        cpu0, t0 = tree_cpu_seconds(pid), time.perf_counter()
        answers, seconds, right = run_sessions(url, shape)
        wall, cpu = time.perf_counter() - t0, tree_cpu_seconds(pid) - cpu0
        text = metrics(engine)
        after, got = read_counters(text), read_pool_blocks(text)
    return {
        "pool_blocks": got,
        "compaction": "watermark" if watermark else "off",
        "seconds_per_step": sum(seconds) / len(seconds),
        "wall_s": wall,
        "cpu_s": cpu,
        "sessions_per_cpu_s": shape.sessions / cpu if cpu else None,
        "right": right,
        "answers": answers,
        **{k: after[k] - before[k] for k in COUNTERS},
    }


def agreement(off: list[list[str]], on: list[list[str]]) -> float:
    """The fraction of steps whose answer on is the answer off (same session, same step)."""
    pairs = [
        (a, b)
        for s_off, s_on in zip(off, on, strict=True)
        for a, b in zip(s_off, s_on, strict=True)
    ]
    return sum(a == b for a, b in pairs) / len(pairs)


def summarize(rounds: Sequence[Mapping[str, Any]], shape: Shape) -> dict[str, Any]:
    off = [r for r in rounds if r["compaction"] == "off"]
    on = [r for r in rounds if r["compaction"] != "off"]

    def mean(runs: list[Mapping[str, Any]], key: str) -> float:
        return sum(float(r[key]) for r in runs) / len(runs)

    steps = shape.sessions * shape.steps
    return {
        "trigger": "watermark",
        "sessions": shape.sessions,
        "steps": shape.steps,
        "pool_blocks": shape.pool_blocks,
        "rounds": len(on),
        "seconds_per_step_off": round(mean(off, "seconds_per_step"), 2),
        "seconds_per_step_on": round(mean(on, "seconds_per_step"), 2),
        "time_ratio": mean(on, "seconds_per_step") / mean(off, "seconds_per_step"),
        "sessions_per_cpu_s_off": mean(off, "sessions_per_cpu_s"),
        "sessions_per_cpu_s_on": mean(on, "sessions_per_cpu_s"),
        "sessions_per_cpu_s_ratio": mean(on, "sessions_per_cpu_s") / mean(off, "sessions_per_cpu_s"),
        "preemptions_off": sum(r["preemptions"] for r in off),
        "preemptions_on": sum(r["preemptions"] for r in on),
        "compactions_on": sum(r["compactions"] for r in on),
        "freed_blocks_on": sum(r["freed_blocks"] for r in on),
        "accuracy_off": mean(off, "right") / steps,
        "accuracy_on": mean(on, "right") / steps,
        "answer_agreement": sum(
            agreement(off[0]["answers"], r["answers"]) for r in on
        ) / len(on),
        # the same between off rounds: how often bf16 batching alone changes an answer
        "answer_agreement_off_rounds": sum(
            agreement(off[0]["answers"], r["answers"]) for r in off[1:]
        ) / (len(off) - 1) if len(off) > 1 else None,
    }  # fmt: skip


def alternate_rounds(
    rounds: int,
    on_label: str,
    run: Callable[[bool], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """``rounds`` rounds of compaction off then on (``run(on)`` starts its own stack), each
    round's result printed as it ends (kept if the run is cut short)."""
    results = []
    for i in range(rounds):
        for on in (False, True):
            label = on_label if on else "off"
            print(f"round {i + 1}/{rounds}, compaction {label}: starting the stack", flush=True)
            result = run(on)
            print(f"  {describe(result)}", flush=True)
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def main(shape: Shape, rounds: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    def describe(r: dict[str, Any]) -> str:
        return (
            f"{r['seconds_per_step']:.1f} s/step, {r['cpu_s']:.0f} CPU-s, "
            f"{r['preemptions']:.0f} preemptions, {r['compactions']:.0f} compactions, "
            f"{r['right']} right"
        )

    results = alternate_rounds(rounds, "watermark", lambda on: run_round(shape, on), describe)
    return results, summarize(results, shape)
