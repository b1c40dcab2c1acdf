"""``bench.kv_session --trigger admission``: long requests arriving at once in a KV pool that
holds about two of them, KV compaction off vs the prompt trigger, alternating in one run.

The shape where compaction can buy concurrency: each request is a long prompt of its own
(no shared prefix, a fact planted in its middle and asked about at its end) and a long
decode (``ignore_eos``, ``--max-tokens``), all sent at once through the gateway into a
full tier whose pool (``--pool-blocks`` of 128 tokens) holds about two of them. Off, vLLM
runs what fits and the rest wait in its queue; on, each request frees ``1 - budget`` of
its prompt's blocks in the step that completes its prefill, so waiting ones are admitted
sooner. Per round: peak and mean of ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` (the full tier's ``/metrics`` sampled every 0.5 s while
requests are out), preemptions and compactions (counter deltas), requests completed per
CPU-second of the stack's process tree, time to the last token (per request and for the
whole burst), decoded tokens per second, right answers; across rounds, how many answers
on are the first off round's. The summary's ``concurrency_ratio`` is peak running on /
off, ``decode_speedup`` decoded tokens per wall second on / off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.kv_pressure import (
    COUNTERS,
    Shape,
    agreement,
    alternate_rounds,
    metrics,
    pressure_stack,
    read_counters,
    read_pool_blocks,
)
from bench.kv_session import FACTS, history
from bench.procs import tree_cpu_seconds

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}


def burst_prompt(k: int, lines: int) -> tuple[str, str]:
    """(user message, expected number) of request ``k``: ``lines`` lines of its own history
    (~27 tokens each) with its fact in the middle, then the question."""
    what, value = FACTS[k % len(FACTS)]
    value = f"{value}{k}"  # a different number per request
    text = history(k * 100 + 7, lines)
    text.insert(lines // 2, f"NOTE: the {what} is {value}.")
    question = f"\n\nQuestion: what is the {what}? Answer with the number only."
    return "\n".join(text) + question, value


def read_gauges(text: str) -> dict[str, float]:
    """The gauges of ``GAUGES`` in a /metrics text, summed over their labels."""
    names = {v: k for k, v in GAUGES.items()}
    out = dict.fromkeys(GAUGES, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in names:
            out[names[family.name]] += sum(float(s.value) for s in family.samples)
    return out


class GaugeSampler:
    """Samples ``GAUGES`` from an engine's /metrics every ``interval_s`` in the background."""

    def __init__(self, engine_url: str, interval_s: float = 0.5) -> None:
        self.url, self.interval_s = engine_url + "/metrics", interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.interval_s):
                try:
                    self.samples.append(read_gauges(client.get(self.url).text))
                except httpx.HTTPError:
                    continue

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in GAUGES:
            values = [s[name] for s in self.samples] or [0.0]
            out[f"peak_{name}"] = max(values)
            out[f"mean_{name}"] = sum(values) / len(values)
        return out


def run_burst(url: str, shape: Shape) -> tuple[list[str], list[float], int, int]:
    """Every request at once; (answers, seconds to each one's last token, right answers,
    tokens decoded)."""
    prompts = [burst_prompt(k, shape.lines) for k in range(shape.sessions)]
    answers, seconds = [""] * len(prompts), [0.0] * len(prompts)
    decoded = [0] * len(prompts)

    def one(k: int) -> None:
        message, _ = prompts[k]
        started = time.perf_counter()
        with httpx.Client(base_url=url, timeout=1800) as client:
            r = client.post("/v1/chat/completions", json={
                "model": "full", "messages": [{"role": "user", "content": message}],
                "max_tokens": shape.max_tokens, "temperature": 0, "ignore_eos": True,
            })  # fmt: skip
        r.raise_for_status()
        data = r.json()
        seconds[k] = time.perf_counter() - started
        answers[k] = data["choices"][0]["message"]["content"] or ""
        decoded[k] = int(data["usage"]["completion_tokens"])

    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(one, range(len(prompts))))
    right = sum(expected in a for (_, expected), a in zip(prompts, answers, strict=True))
    return answers, seconds, right, sum(decoded)


def run_round(shape: Shape, compaction: bool) -> dict[str, Any]:
    with pressure_stack(shape, "prompt" if compaction else None) as (url, engine, pid):
        before = read_counters(metrics(engine))
        cpu0, t0 = tree_cpu_seconds(pid), time.perf_counter()
        with GaugeSampler(engine) as sampler:
            answers, seconds, right, decoded = run_burst(url, shape)
        wall, cpu = time.perf_counter() - t0, tree_cpu_seconds(pid) - cpu0
        text = metrics(engine)
        after, got = read_counters(text), read_pool_blocks(text)
    return {
        "pool_blocks": got,
        "compaction": "prompt" if compaction else "off",
        **sampler.stats(),
        "time_to_last_token_mean_s": sum(seconds) / len(seconds),
        "time_to_last_token_max_s": max(seconds),
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_cpu_s": shape.sessions / cpu if cpu else None,
        "decoded_tokens_per_s": decoded / wall,
        "right": right,
        "answers": answers,
        **{k: after[k] - before[k] for k in COUNTERS},
    }


def summarize(rounds: Sequence[Mapping[str, Any]], shape: Shape) -> dict[str, Any]:
    off = [r for r in rounds if r["compaction"] == "off"]
    on = [r for r in rounds if r["compaction"] != "off"]

    def mean(runs: list[Mapping[str, Any]], key: str) -> float:
        return sum(float(r[key]) for r in runs) / len(runs)

    def ratio(key: str) -> float | None:
        return mean(on, key) / mean(off, key) if mean(off, key) else None

    right_off, right_on = mean(off, "right"), mean(on, "right")
    return {
        "trigger": "admission",
        "requests": shape.sessions,
        "lines": shape.lines,
        "pool_blocks": shape.pool_blocks,
        "max_tokens": shape.max_tokens,
        "budget": shape.budget,
        "rounds": len(on),
        "concurrency_ratio": ratio("peak_running"),
        "mean_running_ratio": ratio("mean_running"),
        "peak_running_off": mean(off, "peak_running"),
        "peak_running_on": mean(on, "peak_running"),
        "peak_waiting_off": mean(off, "peak_waiting"),
        "peak_waiting_on": mean(on, "peak_waiting"),
        "decode_speedup": ratio("decoded_tokens_per_s"),
        "time_to_last_token_ratio": ratio("time_to_last_token_max_s"),
        "requests_per_cpu_s_ratio": ratio("requests_per_cpu_s"),
        "preemptions_off": sum(r["preemptions"] for r in off),
        "preemptions_on": sum(r["preemptions"] for r in on),
        "compactions_on": sum(r["compactions"] for r in on),
        "freed_blocks_on": sum(r["freed_blocks"] for r in on),
        "accuracy_off": right_off / shape.sessions,
        "accuracy_on": right_on / shape.sessions,
        "accuracy_vs_full_cache": right_on / right_off if right_off else None,
        "answer_agreement": sum(agreement([off[0]["answers"]], [r["answers"]]) for r in on)
        / len(on),
    }


def main(shape: Shape, rounds: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    def describe(r: dict[str, Any]) -> str:
        return (
            f"running peak {r['peak_running']:.0f} mean {r['mean_running']:.2f}, "
            f"waiting peak {r['peak_waiting']:.0f}, last token at "
            f"{r['time_to_last_token_max_s']:.1f} s, {r['cpu_s']:.0f} CPU-s, "
            f"{r['preemptions']:.0f} preemptions, {r['compactions']:.0f} compactions, "
            f"{r['right']} right"
        )

    results = alternate_rounds(rounds, "prompt", lambda on: run_round(shape, on), describe)
    return results, summarize(results, shape)
