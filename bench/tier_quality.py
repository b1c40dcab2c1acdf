"""Quality of a candidate tier against the full tier, paired per task, with bootstrap intervals.

Every task is answered by both (or read from a stored outcomes file, ``bench.router_outcomes``:
the same tasks, the same checkers) and scored by the task's own checker — exact answers
normalised by ``bench.router_scoring``, BFCL arguments, HumanEval tests in the sandbox,
reasoning-gym's scorer; never substring containment. ``quality_retention`` is the candidate's
summed score over the full tier's on the same tasks; its interval resamples tasks (paired:
a resampled task brings both of its scores), ``boot`` times, and reads the 2.5th and 97.5th
percentiles. The same per source, so a source the candidate cannot do shows up by name.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.router_outcomes import answer
from bench.router_outcomes import load as load_outcomes
from bench.router_tasks import Task
from bench.tier_speed import Arm

Pairs = list[tuple[str, float, float]]  # (source, full score, candidate score) per task


def _ratio(pairs: Sequence[tuple[str, float, float]]) -> float | None:
    full = sum(p[1] for p in pairs)
    return sum(p[2] for p in pairs) / full if full else None


def retention(pairs: Pairs, boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Means of both, ``quality_retention`` and its paired bootstrap interval."""
    rng = random.Random(seed)
    n = len(pairs)
    draws = sorted(
        r
        for _ in range(boot if n else 0)
        if (r := _ratio([pairs[rng.randrange(n)] for _ in range(n)])) is not None
    )
    point = _ratio(pairs)
    ci = [round(draws[int(0.025 * len(draws))], 3), round(draws[int(0.975 * len(draws)) - 1], 3)] if draws else None  # fmt: skip
    return {
        "tasks": n,
        "full": round(sum(p[1] for p in pairs) / n, 4) if n else None,
        "candidate": round(sum(p[2] for p in pairs) / n, 4) if n else None,
        "quality_retention": round(point, 3) if point is not None else None,
        "ci": ci,
    }


def report(pairs: Pairs, boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Overall figures and the same per source."""
    by_source: dict[str, Pairs] = defaultdict(list)
    for p in pairs:
        by_source[p[0]].append(p)
    overall = retention(pairs, boot, seed)
    return {
        **overall,
        "per_source": {s: retention(ps, boot, seed) for s, ps in sorted(by_source.items())},
    }


def from_outcomes(path: Path, tasks: Sequence[Task]) -> Pairs:
    """The stored full/fast outcomes of ``tasks`` (matched by id and request hash)."""
    stored = load_outcomes(path)
    return [
        (t.source, float(row["full"]["score"]), float(row["fast"]["score"]))
        for t in tasks
        if (row := stored.get(t.key)) is not None
    ]


async def scores(
    arm: Arm,
    tasks: Sequence[Task],
    concurrency: int = 4,
    samples: int = 1,
    temperature: float = 0.7,
) -> dict[str, float]:
    """Each task's score on one arm (greedy; or the mean of ``samples`` at ``temperature``)."""
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(task: Task) -> tuple[str, float]:
            async with gate:
                out = await answer(session, arm.url, arm.model, task, samples, temperature)
                return task.id, float(out["score"])

        return dict(await asyncio.gather(*(one(t) for t in tasks)))


def paired(
    tasks: Sequence[Task], full: Mapping[str, float], candidate: Mapping[str, float]
) -> Pairs:
    return [(t.source, full[t.id], candidate[t.id]) for t in tasks if t.id in full and t.id in candidate]  # fmt: skip
