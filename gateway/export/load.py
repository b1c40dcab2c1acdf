"""Read sessions out of the store as ``Trajectory`` objects, a session at a time."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson
from sqlalchemy import Connection, func, or_, select

from gateway.store import codec, prompt_refs
from gateway.store.rewards import combined
from gateway.store.schema import (
    SUMMARY_POLICY,
    blobs,
    feedback,
    rewards,
    sessions,
    steps,
    tool_calls,
)

# What an export does with context summaries' own model calls (``SUMMARY_POLICY`` steps)
Summaries = Literal["exclude", "include", "only"]
SUMMARIES: tuple[Summaries, ...] = ("exclude", "include", "only")


@dataclass(slots=True)
class Step:
    id: str
    seq: int
    choice_index: int
    tier: str | None
    model: str | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    status: int
    rewritten: bool
    propensity: float | None
    policy: str | None
    rewards: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0  # combined, step scope
    escalated: bool = False  # the routed fast-tier answer failed validation; full answered
    fallback: bool = False  # served by another tier than the one chosen (it was down)

    @property
    def messages(self) -> list[dict[str, Any]]:
        m = self.request.get("messages")
        return list(m) if isinstance(m, list) else []

    @property
    def summary(self) -> bool:
        """A context summary's model call: its prompt is the summarizer's, not the agent's."""
        return self.policy == SUMMARY_POLICY

    @property
    def has_tokens(self) -> bool:
        return (
            bool(self.prompt_ids) and self.completion_ids is not None and self.logprobs is not None
        )


@dataclass(slots=True)
class Trajectory:
    session: dict[str, Any]
    steps: list[Step]
    tool_calls: list[dict[str, Any]]
    rewards: list[dict[str, Any]]  # every component row, all scopes
    feedback: list[dict[str, Any]]
    reward: float = 0.0  # combined over all scopes

    def runs(self) -> list[list[Step]]:
        """The steps cut into conversations, each step of a run extending the one before.

        A step whose history was rewritten (a condensed context: its prompt is the summary
        and what followed it) starts a new run. A call that sampled several answers and a
        summary's own model call each stand alone: nothing continues them.
        """
        per_seq: dict[int, int] = {}
        for s in self.steps:
            per_seq[s.seq] = per_seq.get(s.seq, 0) + 1
        out: list[list[Step]] = []
        joinable = False  # whether the last run may take the next step
        for s in self.steps:
            alone = s.summary or s.choice_index != 0 or per_seq[s.seq] > 1
            if joinable and not alone and not s.rewritten:
                out[-1].append(s)
            else:
                out.append([s])
            joinable = not alone
        return out

    @property
    def group(self) -> str:
        return str(
            self.session.get("group_id") or self.session.get("task_id") or self.session["id"]
        )


@dataclass(frozen=True, slots=True)
class Filter:
    tenant: str | None = None  # None: every tenant (operator export)
    since: datetime | None = None
    until: datetime | None = None  # sessions started before this
    min_reward: float | None = None
    only_ok: bool = True  # leave out steps that failed (no answer to learn from)
    # a context summary's model calls: left out of the agent's steps unless asked for
    summaries: Summaries = "exclude"


def count(conn: Connection, flt: Filter) -> int:
    q = select(func.count()).select_from(sessions)
    return int(conn.execute(_where(q, flt)).scalar() or 0)


def _where(q: Any, flt: Filter) -> Any:
    if flt.tenant is not None:
        q = q.where(sessions.c.tenant_id == flt.tenant)
    if flt.since is not None:
        q = q.where(sessions.c.created_at >= flt.since)
    if flt.until is not None:
        q = q.where(sessions.c.created_at < flt.until)
    return q


def trajectories(
    conn: Connection, flt: Filter, weights: Mapping[str, float]
) -> Iterator[Trajectory]:
    q = _where(select(sessions).order_by(sessions.c.created_at, sessions.c.id), flt)
    for srow in conn.execute(q).all():
        t = _load(conn, dict(srow._mapping), flt, weights)
        if t.steps and (flt.min_reward is None or t.reward >= flt.min_reward):
            yield t


def _load(
    conn: Connection, session: dict[str, Any], flt: Filter, weights: Mapping[str, float]
) -> Trajectory:
    sid = session["id"]
    q = (
        select(steps, blobs.c.body)
        .join(blobs, blobs.c.sha256 == steps.c.request_sha256)
        .where(steps.c.session_id == sid)
        .order_by(steps.c.seq, steps.c.choice_index)
    )
    if flt.only_ok:
        q = q.where(steps.c.status == 200)
    if flt.summaries == "exclude":
        q = q.where(or_(steps.c.policy.is_(None), steps.c.policy != SUMMARY_POLICY))
    elif flt.summaries == "only":
        q = q.where(steps.c.policy == SUMMARY_POLICY)
    rw = [
        dict(r._mapping)
        for r in conn.execute(
            select(rewards).where(rewards.c.session_id == sid).order_by(rewards.c.id)
        )
    ]
    by_step: dict[str, dict[str, float]] = {}
    for r in rw:
        if r["scope"] == "step" and r["step_id"]:
            by_step.setdefault(r["step_id"], {})[r["name"]] = r["value"]
    rows = [row._mapping for row in conn.execute(q)]
    prompts = prompt_refs.prompt_ids(conn, rows)
    out = []
    for m in rows:
        comps = by_step.get(m["id"], {})
        out.append(
            Step(
                id=m["id"], seq=m["seq"], choice_index=m["choice_index"], tier=m["tier"],
                model=m["model"], request=orjson.loads(m["body"]), response=m["response"],
                prompt_ids=prompts[m["id"]],
                completion_ids=codec.unpack_ids(m["completion_token_ids"]),
                logprobs=codec.unpack_floats(m["logprobs"]), finish_reason=m["finish_reason"],
                status=m["status"], rewritten=m["rewritten"], propensity=m["propensity"],
                policy=m["policy"], rewards=comps, reward=combined(comps.items(), weights),
                escalated=m["escalated"], fallback=m["fallback"],
            )
        )  # fmt: skip
    calls = [
        dict(r._mapping)
        for r in conn.execute(
            select(tool_calls)
            .where(tool_calls.c.session_id == sid)
            .order_by(tool_calls.c.created_at)
        )
    ]
    fb = [
        dict(r._mapping) for r in conn.execute(select(feedback).where(feedback.c.session_id == sid))
    ]
    total = combined(((r["name"], r["value"]) for r in rw), weights)
    return Trajectory(session, out, calls, rw, fb, total)


def assistant_message(step: Step) -> dict[str, Any]:
    """The answer as a chat message a trainer accepts (role, content, tool_calls only)."""
    r = step.response or {}
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": r.get("content") if "content" in r else r.get("text"),
    }
    if r.get("tool_calls"):
        msg["tool_calls"] = [
            {"id": tc.get("id"), "type": "function", "function": tc.get("function")}
            for tc in r["tool_calls"]
        ]
    return msg
