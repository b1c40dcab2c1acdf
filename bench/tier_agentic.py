"""The agentic workload of ``bench.tiers``: stored tool-loop steps, replayed, and whether the
candidate tier makes the full tier's tool call.

``load`` reads the steps ``bench.agentic_sessions`` generated on the real stack
(``bench/data/agentic_sessions.jsonl``): each step's request is what a client sent at that
point of its session (history, tool schemas, ``tool_choice`` naming the forced tool, or
none on the last step), so replaying them against every arm asks what an agent's loop asks.

``replay`` measures them like the other workloads (``bench.tier_speed``: seconds per step to
the last token at concurrency 1, completed steps/s at 4, answer length) and keeps each arm's
answers at concurrency 1 for ``agreement``, the quality proxy for tool steps: a step agrees
when the candidate's first tool call has the reference's name and the same arguments, parsed
as JSON (key order and spacing aside; arguments that do not parse are compared as text; two
answers without a call agree), with a 95% bootstrap
interval over sessions (a session's steps share their history, so they are resampled
together). Free steps (the last of each session) are reported apart as the share whose text
is identical.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.tier_speed import Arm, compare, measure

DATA = Path(__file__).parent / "data" / "agentic_sessions.jsonl"


@dataclass(frozen=True)
class Step:
    session: str
    step: int
    forced: str | None  # the tool the step forced; None on a free step
    request: dict[str, Any]


def load(
    path: Path = DATA, sessions: int | None = None, max_tokens: int | None = None
) -> list[Step]:
    """The steps of the first ``sessions`` sessions (all when None), in file order;
    ``max_tokens`` caps every request's."""
    steps: list[Step] = []
    seen: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row["session"] not in seen:
            if sessions is not None and len(seen) == sessions:
                break
            seen.append(row["session"])
        request = {k: v for k, v in row["request"].items() if k != "model"}
        if max_tokens is not None:
            request["max_tokens"] = min(int(request.get("max_tokens", max_tokens)), max_tokens)
        steps.append(Step(row["session"], int(row["step"]), row.get("forced"), request))
    return steps


def call_key(message: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(name, canonical arguments) of a message's first tool call; None when it made none."""
    calls = (message or {}).get("tool_calls") or []
    if not calls:
        return None
    fn = calls[0].get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        args = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError:
        args = raw
    return str(fn.get("name")), args


def _ratio_ci(
    per_session: Sequence[tuple[int, int]], boot: int, seed: int = 0
) -> tuple[float | None, list[float | None]]:
    """Sum of agreements over sum of steps, and a 95% interval resampling sessions."""
    total = sum(n for _, n in per_session)
    if not total:
        return None, [None, None]
    value = sum(a for a, _ in per_session) / total
    rng, draws = random.Random(seed), []
    for _ in range(boot):
        sample = [per_session[rng.randrange(len(per_session))] for _ in per_session]
        n = sum(s for _, s in sample)
        if n:
            draws.append(sum(a for a, _ in sample) / n)
    draws.sort()
    if not draws:
        return round(value, 4), [None, None]
    lo, hi = draws[int(0.025 * (len(draws) - 1))], draws[int(0.975 * (len(draws) - 1))]
    return round(value, 4), [round(lo, 4), round(hi, 4)]


def agreement(
    steps: Sequence[Step],
    reference: Sequence[Mapping[str, Any] | None],
    candidate: Sequence[Mapping[str, Any] | None],
    boot: int = 2000,
) -> dict[str, Any]:
    """How often the candidate's answers match the reference's, step by step (the three
    sequences are aligned): tool steps by call, free steps by text."""
    tool: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    free = [0, 0]
    for step, ref, cand in zip(steps, reference, candidate, strict=True):
        if step.forced is None:
            free[0] += int((ref or {}).get("content") == (cand or {}).get("content"))
            free[1] += 1
        else:
            tool[step.session][0] += int(call_key(ref) == call_key(cand))
            tool[step.session][1] += 1
    value, ci = _ratio_ci([(a, n) for a, n in tool.values()], boot)
    return {
        "tool_steps": sum(n for _, n in tool.values()),
        "toolcall_agreement": value,
        "ci": ci,
        "free_steps": free[1],
        "free_text_identical": round(free[0] / free[1], 4) if free[1] else None,
    }


async def replay(
    arms: Sequence[Arm],
    steps: Sequence[Step],
    concurrencies: Sequence[int],
    warmup: bool = True,
    progress: bool = False,
    boot: int = 2000,
) -> dict[str, dict[str, Any]]:
    """Per arm (the first is the reference): ``speed`` (figures and ratios, as the other
    workloads) and, for the others, ``agreement`` with the reference's answers."""
    answers: dict[str, list[dict[str, Any] | None]] = {}
    bodies = [s.request for s in steps]
    figures = await measure(
        arms, bodies, concurrencies, warmup=warmup, progress=progress, answers=answers
    )
    ratios = compare(figures, arms[0].name)
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        out[arm.name] = {"speed": {**figures[arm.name], **ratios[arm.name]}}
        if arm is not arms[0]:
            ref = answers[arms[0].name]
            out[arm.name]["agreement"] = agreement(steps, ref, answers[arm.name], boot)
    return out
