"""The hosted loop's decisions: after each model step, run hosted calls and step again, or end.

    a step's answer          what happens
    no tool call             the response ends (completed, or incomplete when the answer
                             was cut: max_output_tokens / content_filter)
    hosted calls only        they run, then the next step
    hosted and client calls  the hosted calls run, the response ends with the client's
                             function_call items (a client tool never runs here)
    client calls only        the response ends with them
    (calls waiting for approval, mcp_approval_request items, count as client calls)

Caps end the response ``incomplete`` with ``incomplete_details.reason``: ``max_tool_calls``
(hosted calls per response: the calls over it are not run, their items stay
``incomplete``), ``max_turns`` (model steps per response, ``responses.max_turns``),
``max_output_tokens`` (counted over all steps), ``max_total_tokens`` (input + output tokens
of all steps, ``responses.max_total_tokens``) and ``max_wall_s`` (``responses.max_wall_s``,
``wall``: no step starts after the deadline, one running then is stopped). Each step's
``max_tokens`` is what is left of both token caps. Pure but for the clock: ``serving``
does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.pipeline.responses.items import HOSTED_ITEMS
from gateway.pipeline.responses.output import status_of
from gateway.pipeline.responses.wall import WallClock

WALL = "max_wall_s"  # the reason of a response stopped by its wall-clock cap


def not_run(reason: str | None) -> str:
    """What the model is told of a hosted call that a cap left unrun."""
    return f"error: not run: the response reached {reason or 'a cap'}"


@dataclass(slots=True)
class StepAnswer:
    """One model step, as output items (hosted calls already as hosted items)."""

    items: list[dict[str, Any]]
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    arguments: dict[str, str] = field(default_factory=dict)  # hosted item id -> raw arguments
    error: dict[str, Any] | None = None  # the tier failed mid-step


@dataclass(frozen=True, slots=True)
class Decision:
    run: list[dict[str, Any]]  # hosted calls to run now, in order
    skipped: list[dict[str, Any]]  # hosted calls over max_tool_calls: not run
    end: bool
    status: str = "completed"
    reason: str | None = None  # incomplete_details.reason

    @property
    def incomplete(self) -> dict[str, Any] | None:
        return {"reason": self.reason} if self.reason else None


def decide(
    answer: StepAnswer, *, calls: int, max_tool_calls: int | None, turn: int, max_turns: int,
    tokens_left: int | None, total_left: int | None = None,
) -> Decision:  # fmt: skip
    """What follows step ``turn`` (from 0), ``calls`` hosted calls having run before it;
    ``tokens_left`` / ``total_left``: what is left of max_output_tokens / max_total_tokens."""
    hosted = [i for i in answer.items if i["type"] in HOSTED_ITEMS]
    # the client's calls, and calls that wait for approval, end the response
    client = any(i["type"] in ("function_call", "mcp_approval_request") for i in answer.items)
    status, incomplete = status_of(answer.finish_reason)
    if incomplete is not None:  # a cut answer: its calls' arguments may be cut too
        reason = incomplete["reason"]
        if reason == "max_output_tokens" and _spent(total_left) and not _spent(tokens_left):
            reason = "max_total_tokens"  # the step's max_tokens was what the total left
        return Decision([], hosted, True, status, reason)
    if not hosted:
        return Decision([], [], True)
    room = len(hosted) if max_tool_calls is None else max(0, max_tool_calls - calls)
    run, skipped = hosted[:room], hosted[room:]
    if skipped:
        return Decision(run, skipped, True, "incomplete", "max_tool_calls")
    if client:
        return Decision(run, [], True)
    if turn + 1 >= max_turns:
        return Decision(run, [], True, "incomplete", "max_turns")
    if _spent(tokens_left):
        return Decision(run, [], True, "incomplete", "max_output_tokens")
    if _spent(total_left):
        return Decision(run, [], True, "incomplete", "max_total_tokens")
    return Decision(run, [], False)


def _spent(left: int | None) -> bool:
    return left is not None and left <= 0


def add_usage(total: dict[str, Any] | None, step: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage summed over a response's steps."""
    if step is None or total is None:
        return total or step
    out = {k: total[k] + step[k] for k in ("input_tokens", "output_tokens", "total_tokens")}
    cached = total["input_tokens_details"]["cached_tokens"]
    cached += step["input_tokens_details"]["cached_tokens"]
    return {
        **out,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


@dataclass(slots=True)
class LoopState:
    """What a response has done so far: its output, usage, steps and hosted calls."""

    max_tool_calls: int | None
    max_output_tokens: int | None
    max_turns: int
    max_total_tokens: int | None = None
    wall: WallClock = field(default_factory=lambda: WallClock(None))
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    model: str | None = None
    turns: int = 0
    calls: int = 0
    committed: bool = False  # calls ran before the first step: the response is stored

    @property
    def tokens_left(self) -> int | None:
        if self.max_output_tokens is None:
            return None
        used = (self.usage or {}).get("output_tokens", 0)
        return int(self.max_output_tokens - used)

    @property
    def total_left(self) -> int | None:
        if self.max_total_tokens is None:
            return None
        return int(self.max_total_tokens - (self.usage or {}).get("total_tokens", 0))

    @property
    def step_tokens(self) -> int | None:
        """The next step's ``max_tokens``: what is left of both token caps."""
        left = [n for n in (self.tokens_left, self.total_left) if n is not None]
        return min(left, default=None)

    def add(self, answer: StepAnswer) -> Decision:
        """Count a finished step (its items are already in ``output``) and decide."""
        self.usage = add_usage(self.usage, answer.usage)
        self.model = answer.model or self.model
        decision = decide(
            answer, calls=self.calls, max_tool_calls=self.max_tool_calls, turn=self.turns,
            max_turns=self.max_turns, tokens_left=self.tokens_left, total_left=self.total_left,
        )  # fmt: skip
        self.turns += 1
        self.calls += len(decision.run)
        return decision

    def timed(self, decision: Decision) -> Decision:
        """The decision once the step's hosted calls have run: past the wall-clock cap, no
        next step; calls left unrun at the deadline (``wall.hit``) make it the reason."""
        if self.wall.hit or (not decision.end and self.wall.expired):
            return Decision(decision.run, [], True, "incomplete", WALL)
        return decision

    def stopped(self, answer: StepAnswer | None = None) -> Decision:
        """A model step stopped at the deadline (``wall.hit``): its hosted calls (their
        arguments may be cut) are not run."""
        if answer is not None:
            self.usage = add_usage(self.usage, answer.usage)
            self.turns += 1
        cut = [i for i in (answer.items if answer else ()) if i["type"] in HOSTED_ITEMS]
        return Decision([], cut, True, "incomplete", WALL)
