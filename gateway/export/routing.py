"""Routed steps out of the store as ``router.offpolicy.Logged``: what ``gearshift router
train --from-store`` learns from.

A step counts when a routing policy chose its tier (not a pinned model, not a fallback to
the other tier) and it has a propensity. Its reward is the combined reward (export weights)
of its own components, of the tool calls it made and, unless left out, of its session's
session-scope components (an episode's outcome is shared by the steps that led to it). An
escalated step is the fast tier's: its answer failed validation and the client got the full
tier's, so it is logged as a fast-tier step with ``escalation_reward``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from sqlalchemy import Connection

from gateway.export.load import Filter, Trajectory, trajectories
from gateway.store.rewards import combined
from router.offpolicy import Logged
from router.types import Tier


@dataclass(frozen=True, slots=True)
class Options:
    escalation_reward: float = -1.0
    session_rewards: bool = True


@dataclass(slots=True)
class Counts:
    sessions: int = 0
    steps: int = 0  # every step read
    pinned: int = 0  # a model named by the client, no routing decision
    fallback: int = 0
    escalated: int = 0  # kept, as fast-tier steps


def _session_reward(t: Trajectory, weights: Mapping[str, float]) -> float:
    return combined(
        ((r["name"], r["value"]) for r in t.rewards if r["scope"] == "session"), weights
    )


def _tool_rewards(t: Trajectory, weights: Mapping[str, float]) -> dict[str, float]:
    """Combined tool-call rewards by the step that made the calls."""
    step_of = {c["id"]: c["step_id"] for c in t.tool_calls}
    out: dict[str, float] = {}
    for r in t.rewards:
        if r["scope"] == "tool_call" and r["tool_call_id"] in step_of:
            step = step_of[r["tool_call_id"]]
            out[step] = out.get(step, 0.0) + weights.get(r["name"], 0.0) * r["value"]
    return out


def logged_steps(
    conn: Connection,
    flt: Filter,
    weights: Mapping[str, float],
    options: Options = Options(),
    counts: Counts | None = None,
    on_session: Callable[[], None] | None = None,
) -> Iterator[Logged]:
    counts = counts if counts is not None else Counts()
    # A context summary's model call is no routing decision (the summarizer's tier is set).
    every = replace(flt, only_ok=False, summaries="exclude")
    for t in trajectories(conn, every, weights):
        counts.sessions += 1
        if on_session is not None:
            on_session()
        shared = _session_reward(t, weights) if options.session_rewards else 0.0
        tools = _tool_rewards(t, weights)
        for s in t.steps:
            counts.steps += 1
            if (
                s.policy in (None, "pinned")
                or s.propensity is None
                or s.tier not in ("full", "fast")
            ):
                counts.pinned += 1
                continue
            if s.fallback:
                counts.fallback += 1
                continue
            if s.escalated:
                counts.escalated += 1
                tier, reward = Tier.FAST, options.escalation_reward
            else:
                tier, reward = Tier(s.tier), s.reward + tools.get(s.id, 0.0)
            yield Logged(s.id, s.request, tier, s.propensity, reward + shared, t.group)
