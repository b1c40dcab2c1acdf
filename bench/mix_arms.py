"""The arms of ``bench.routed_mix``, one task request each, and the figures per arm.

An arm is a model name sent to a gateway: ``routed`` asks for ``auto`` (the router
decides), ``full`` and ``fast`` pin a tier (always-full, always-fast); ``full-x2`` asks for
``full`` too, from a gateway whose full tier has two replicas (``bench.mix_replicas``).
Every request is the
task's body, greedy (``temperature: 0``, ``seed: 0``), with its own ``X-Session-Id``. The
tier that served it and the router's reason come back in ``x-gearshift-tier`` and
``x-gearshift-route-reason``; from them ``decided`` is the tier the router chose (a fast
answer the gateway escalated was chosen fast; a fallback was chosen for the other tier).
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.router_tasks import Task

ARMS = ("routed", "full", "fast")  # every run's; the stack's gateway serves them
FULL_X2 = "full-x2"
MODELS = {"routed": "auto", "full": "full", "fast": "fast", FULL_X2: "full"}


@dataclass
class Outcome:
    task_id: str
    seconds: float  # request to the whole answer
    status: int
    message: dict[str, Any] | None  # the first choice's message (None: the task failed)
    tier: str | None  # x-gearshift-tier
    reason: str  # x-gearshift-route-reason

    @property
    def decided(self) -> str | None:
        if self.tier is None:
            return None
        if "escalated to full" in self.reason:
            return "fast"
        if "; fallback to " in self.reason:
            return "fast" if self.tier == "full" else "full"
        return self.tier


async def ask(
    session: aiohttp.ClientSession, url: str, arm: str, task: Task, session_id: str
) -> Outcome:
    """One greedy answer of ``task`` on ``arm``. A 500, 502 (the tier failed the task after
    the gateway's retries) or 504 (it did not answer within ``timeouts.first_byte_s``) is an
    outcome scoring 0, not completed: what the user got; any other error status raises."""
    body = {**task.body, "model": MODELS[arm], "temperature": 0, "seed": 0}
    headers = {"X-Session-Id": session_id}
    for attempt in range(3):  # a pooled connection can drop as it is reused: ask again
        started = time.perf_counter()
        try:
            async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:  # fmt: skip
                data = await resp.json(content_type=None)
                seconds = time.perf_counter() - started
                tier = resp.headers.get("x-gearshift-tier")
                reason = resp.headers.get("x-gearshift-route-reason", "")
                if resp.status in (500, 502, 504):
                    return Outcome(task.id, seconds, resp.status, None, tier, reason)
                if resp.status != 200:
                    raise RuntimeError(f"{task.id} on {arm}: HTTP {resp.status}: {str(data)[:300]}")  # fmt: skip
                return Outcome(task.id, seconds, 200, data["choices"][0]["message"], tier, reason)
        except aiohttp.ClientConnectionError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


async def scored(tasks: Sequence[Task], outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Each task's score by its own checker (0 for a failed request)."""
    by_id = {t.id: t for t in tasks}
    out = {}
    for o in outcomes:
        check = by_id[o.task_id].check
        score: Any = 0.0
        if o.message is not None and check is not None:
            score = check(o.message)
            if inspect.isawaitable(score):
                score = await score
        out[o.task_id] = round(float(score), 4)
    return out


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def arm_figures(tally: Mapping[str, Any]) -> dict[str, Any]:
    """One arm's figures from its outcomes, scores, CPU and wall seconds."""
    outs: list[Outcome] = tally["out"]
    done = [o for o in outs if o.status == 200]
    seconds = [o.seconds for o in outs]
    cpu_s, wall_s = tally["cpu_s"], tally["wall_s"]
    decided = [o.decided for o in outs]
    scores = tally["scores"]
    n = len(outs)
    return {
        "tasks": n,
        "completed": len(done),
        "cpu_s": round(cpu_s, 2) if cpu_s is not None else None,
        "wall_s": round(wall_s, 2),
        "tasks_per_cpu_s": _sig(len(done) / cpu_s) if cpu_s else None,
        "tasks_per_s": _sig(len(done) / wall_s) if wall_s else None,
        "s_per_task_mean": _sig(statistics.fmean(seconds)) if seconds else None,
        "s_per_task_p50": _sig(statistics.median(seconds)) if seconds else None,
        "quality": round(statistics.fmean(scores.values()), 4) if scores else None,
        "tier_share": {t: round(decided.count(t) / n, 3) if n else None for t in ("full", "fast")},
        "escalated": sum(1 for o in outs if "escalated to full" in o.reason),
    }


def ratio(
    arms: Mapping[str, Mapping[str, Any]], arm: str, key: str, base: str = "full"
) -> float | None:
    """``arm``'s figure ``key`` over ``base``'s (None where either has none)."""
    a, b = arms[arm].get(key), arms[base].get(key) if base in arms else None
    return round(a / b, 3) if a is not None and b else None


def against_full(
    arms: Mapping[str, Mapping[str, Any]], arm: str, quality: float | None, ci_low: float | None
) -> dict[str, Any]:
    """An arm's headline figures over always-full's: tasks per CPU-second and time per task
    as ratios (None where either side has none), and its quality against full."""
    return {
        "tasks_per_cpu_s_ratio": ratio(arms, arm, "tasks_per_cpu_s"),
        "time_per_task_ratio": ratio(arms, arm, "s_per_task_mean"),
        "quality_vs_full": quality,
        "quality_vs_full_ci_low": ci_low,
    }


def served_split(outcomes: Sequence[Outcome]) -> dict[str, str]:
    """Per task id, the tier the router chose (for ``bench.mix_replay.agreement``)."""
    return {o.task_id: d for o in outcomes if (d := o.decided) is not None}
