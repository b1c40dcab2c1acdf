"""The routed mix on agent sessions: ``python -m bench.routed_mix --agentic-sessions N``.

The stored tool-loop sessions (``bench/data/agentic_sessions.jsonl``, ``bench.tier_agentic``)
go through the gateway the three ways of ``bench.routed_mix`` — **routed** (``model: auto``),
**always-full** and **always-fast** — as an agent would send them: each (arm, session) is one
``X-Session-Id`` and a session's steps go in order. Round k sends step k of every session
that has one, ``--concurrency`` at a time, so the session policy sees the loop as it happens
(stickiness to full inside a tool loop, a cooldown after an escalation) and no session has
two steps in flight. The arms take turns round by round, the order rotating, and each is
charged the stack's CPU seconds (``bench.mix_cpu``) and wall time of its own rounds. Each
arm's requests carry their own vLLM ``cache_salt``: an arm reuses the prefix cache of its own
earlier steps, as an agent would, but never another arm's.

Each step is the stored request (its history is what the full tier answered when the
sessions were generated), greedy. Quality is agreement with always-full, step by step
(``bench.tier_agentic.agreement``: a forced step agrees when its first call has full's name
and parsed arguments, a free step when its text is identical), with a 95% interval resampling
sessions; an arm's ``quality`` is its mean per-step agreement. The summary has the keys of
``bench.routed_mix``'s (``tasks`` are steps).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from bench.mix_arms import ARMS, Outcome, against_full, arm_figures, ask
from bench.mix_cpu import StackCpu
from bench.router_tasks import Task
from bench.tier_agentic import Step, agreement, call_key, load


def step_id(step: Step) -> str:
    return f"{step.session}/{step.step}"


def as_task(step: Step, cache_salt: str | None = None) -> Task:
    """The step as a ``bench.mix_arms`` task; ``cache_salt`` (vLLM's) keeps its prefix cache
    apart from other arms' (routed and always-full ask the same server the same prompts, and
    agent steps are prefill-bound: the arm that went second would get the first's prefill)."""
    body = step.request if cache_salt is None else {**step.request, "cache_salt": cache_salt}
    return Task(step_id(step), "agentic", step.session, None, body)


def rounds(steps: Sequence[Step]) -> list[list[Step]]:
    """Round k: step k of every session that has one, in file order."""
    by_session: dict[str, list[Step]] = {}
    for s in steps:
        by_session.setdefault(s.session, []).append(s)
    longest = max((len(v) for v in by_session.values()), default=0)
    return [[v[k] for v in by_session.values() if k < len(v)] for k in range(longest)]


def step_scores(
    steps: Sequence[Step], reference: dict[str, Outcome], candidate: dict[str, Outcome]
) -> dict[str, float]:
    """1.0 where the candidate's answer agrees with the reference's (``agreement``'s rule)."""
    out = {}
    for s in steps:
        ref, cand = reference[step_id(s)].message, candidate[step_id(s)].message
        if s.forced is None:
            same = (ref or {}).get("content") == (cand or {}).get("content")
        else:
            same = call_key(ref) == call_key(cand)
        out[step_id(s)] = float(same)
    return out


async def measure(
    url: str, steps: Sequence[Step], concurrency: int, cpu: StackCpu, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Per arm: its outcomes, CPU seconds and wall seconds, round by round in turns."""
    run = uuid.uuid4().hex[:8]
    tally: dict[str, dict[str, Any]] = {a: {"out": [], "cpu_s": 0.0, "wall_s": 0.0} for a in ARMS}  # fmt: skip
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one(arm: str, step: Step) -> Outcome:
            async with gate:
                sid = f"routed-mix-{run}-{arm}-{step.session}"
                return await ask(session, url, arm, as_task(step, f"{run}-{arm}"), sid)

        warm = Task("warmup", "warmup", "warmup", None, {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})  # fmt: skip
        for arm in ("full", "fast"):  # a fresh server's first request pays one-off costs
            await ask(session, url, arm, warm, f"routed-mix-{run}-warmup")
        for k, batch in enumerate(rounds(steps)):
            for arm in [*ARMS[k % 3 :], *ARMS[: k % 3]]:
                c0, t0 = cpu.seconds(), time.perf_counter()
                outs = await asyncio.gather(*(one(arm, s) for s in batch))
                wall, c1 = time.perf_counter() - t0, cpu.seconds()
                t = tally[arm]
                t["out"] += outs
                t["wall_s"] += wall
                t["cpu_s"] = None if c0 is None or c1 is None or t["cpu_s"] is None else t["cpu_s"] + c1 - c0  # fmt: skip
            log(f"  round {k + 1}: {len(batch)} steps, each arm")
    return tally


def summarize(
    steps: Sequence[Step], tally: dict[str, dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    by_arm = {a: {o.task_id: o for o in tally[a]["out"]} for a in ARMS}
    ordered = {a: [by_arm[a][step_id(s)].message for s in steps] for a in ARMS}
    arms: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        tally[arm]["scores"] = step_scores(steps, by_arm["full"], by_arm[arm])
        arms[arm] = arm_figures(tally[arm])
        if arm != "full":
            arms[arm]["vs_full"] = agreement(steps, ordered["full"], ordered[arm], args.boot)

    def versus(arm: str) -> dict[str, Any]:
        q = arms[arm]["vs_full"]
        return against_full(arms, arm, q["toolcall_agreement"], q["ci"][0])

    return {
        **versus("routed"),
        "fast_share": arms["routed"]["tier_share"]["fast"],
        "baseline_fast": versus("fast"),
        "workload": "agentic",
        "sessions": len({s.session for s in steps}),
        "tasks": len(steps),
        "forced_steps": sum(1 for s in steps if s.forced is not None),
        "concurrency": args.concurrency,
        "threshold": args.threshold,
        "arms": arms,
    }


def run(
    args: argparse.Namespace, url: str, cpu: StackCpu, log: Callable[[str], None]
) -> dict[str, Any]:
    steps = load(args.agentic, args.agentic_sessions, 16 if args.quick else None)
    if args.quick:  # a smoke run: the first step of each session
        steps = [s for s in steps if s.step == 0]
    if not steps:
        raise SystemExit(f"no agentic steps in {args.agentic}")
    log(f"{len(steps)} agentic steps of {len({s.session for s in steps})} sessions, 3 arms")
    tally = asyncio.run(measure(url, steps, args.concurrency, cpu, log))
    return summarize(steps, tally, args)
