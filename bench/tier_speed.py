"""Time per answer and completed requests per second of several tiers on identical prompts.

An **arm** is one way to answer (a server URL and the model name to ask it for): the full
tier, the fast tier, or a candidate fast tier. Every arm gets the same chat requests,
greedy, and the arms take turns request by request (concurrency 1) and batch by batch
(concurrency 4), the order rotating, so a burst of noise on a shared machine hits all of
them rather than one arm's whole measurement. One unmeasured warm-up request per arm runs
first (a fresh vLLM server, ngram speculation's numba JIT, pay a first-use cost).

Per arm and concurrency: ``s_per_answer`` (mean seconds from sending a request to having
its whole answer), ``rps`` (requests completed over the wall time of the batches),
``tokens`` (mean completion tokens per answer) and ``tok_s`` (completion tokens over that
time, the secondary figure). ``compare`` turns them into ratios against a reference arm:
``answer_speedup_c1`` (reference's seconds per answer over the arm's), ``rps_speedup_c4``
and ``length_ratio`` (the arm's tokens over the reference's: a tier that writes longer
answers does not save its users what its tokens/s promise).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Arm:
    name: str
    url: str  # a gateway or a vLLM server (OpenAI API)
    model: str  # the model name to ask that server for


@dataclass
class Tally:
    seconds: list[float] = field(default_factory=list)  # per answer
    tokens: list[int] = field(default_factory=list)
    wall: float = 0.0  # summed wall time of the batches (concurrency > 1) or the answers

    def figures(self) -> dict[str, float]:
        n = len(self.seconds)
        if not n:
            return {}
        return {  # four significant digits: a fast test server's times do not round to 0
            "answers": n,
            "s_per_answer": _sig(sum(self.seconds) / n),
            "rps": _sig(n / self.wall),
            "tokens": round(sum(self.tokens) / n, 1),
            "tok_s": _sig(sum(self.tokens) / self.wall),
        }


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


async def one_answer(
    session: aiohttp.ClientSession, arm: Arm, body: Mapping[str, Any]
) -> tuple[float, int, dict[str, Any]]:
    """(seconds from request to the whole answer, completion tokens, the answer's message),
    greedy."""
    request = {**body, "model": arm.model, "temperature": 0, "seed": 0}
    started = time.perf_counter()
    async with session.post(arm.url + "/v1/chat/completions", json=request) as resp:
        data = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"{arm.name}: HTTP {resp.status}: {str(data)[:300]}")
    seconds = time.perf_counter() - started
    return seconds, int(data["usage"]["completion_tokens"]), data["choices"][0]["message"]


def _rotated(arms: Sequence[Arm], k: int) -> list[Arm]:
    k %= len(arms)
    return [*arms[k:], *arms[:k]]


async def measure(
    arms: Sequence[Arm],
    bodies: Sequence[Mapping[str, Any]],
    concurrencies: Sequence[int] = (1, 4),
    rounds: int = 1,
    warmup: bool = True,
    progress: bool = False,
    answers: dict[str, list[dict[str, Any] | None]] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{arm: {"c1": figures, "c4": figures}}`` over ``rounds`` passes of ``bodies``.
    ``answers``, when given, gets each arm's messages, in the order of ``bodies``, from the
    first concurrency's last pass (at concurrency 1 a greedy answer is batch-free)."""
    if answers is not None:
        answers.update({a.name: [None] * len(bodies) for a in arms})
    tallies = {a.name: {f"c{c}": Tally() for c in concurrencies} for a in arms}
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        if warmup:
            for arm in arms:
                await one_answer(session, arm, bodies[0])
        turn = 0
        for _ in range(rounds):
            for c in concurrencies:
                for start in range(0, len(bodies), c):
                    batch = bodies[start : start + c]
                    for arm in _rotated(arms, turn):
                        began = time.perf_counter()
                        done = await asyncio.gather(*(one_answer(session, arm, b) for b in batch))
                        tally = tallies[arm.name][f"c{c}"]
                        tally.wall += time.perf_counter() - began
                        tally.seconds += [s for s, _, _ in done]
                        tally.tokens += [n for _, n, _ in done]
                        if answers is not None and c == concurrencies[0]:
                            answers[arm.name][start : start + len(done)] = [m for *_, m in done]
                    turn += 1
                    if progress:
                        print(f"  speed c{c}: {start + len(batch)}/{len(bodies)}", flush=True)
    return {name: {c: t.figures() for c, t in per.items()} for name, per in tallies.items()}


def compare(
    figures: Mapping[str, Mapping[str, Mapping[str, float]]], reference: str
) -> dict[str, dict[str, float | None]]:
    """Each arm's ratios against ``reference`` (see the module docstring)."""
    ref = figures[reference]
    out: dict[str, dict[str, float | None]] = {}
    for name, per in figures.items():
        ratios: dict[str, float | None] = {}
        for c, f in per.items():
            r = ref.get(c) or {}
            if not f or not r:
                continue
            ratios[f"answer_speedup_{c}"] = round(r["s_per_answer"] / f["s_per_answer"], 3)
            ratios[f"rps_speedup_{c}"] = round(f["rps"] / r["rps"], 3)
            ratios[f"tok_s_speedup_{c}"] = round(f["tok_s"] / r["tok_s"], 3)
            ratios[f"length_ratio_{c}"] = (
                round(f["tokens"] / r["tokens"], 3) if r["tokens"] else None
            )
        out[name] = ratios
    return out
