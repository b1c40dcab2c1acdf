"""Seeded fault injection, so that one sandbox can also serve as an RL environment.

``Faults`` draws the fault for each call of a session; ``FAULTS`` says what each kind of
fault makes the call's result look like (nothing runs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sandbox.protocol import FaultKind, FaultPlan, ToolResult


class Faults:
    def __init__(self, plan: FaultPlan | None) -> None:
        self.plan = plan
        self._rng = random.Random(plan.seed if plan else 0)
        self._calls = 0

    @property
    def retry_after_s(self) -> float:
        """What a rate-limit fault tells the caller to wait."""
        return self.plan.retry_after_s if self.plan else 1.0

    def next(self) -> FaultKind | None:
        """The fault for the next call, if any: the script first, then the rules in order."""
        plan = self.plan
        if plan is None:
            return None
        call, self._calls = self._calls, self._calls + 1
        if call < len(plan.script):
            return plan.script[call]
        for rule in plan.rules:
            if self._rng.random() < rule.probability:
                return rule.kind
        return None


@dataclass(frozen=True, slots=True)
class Injected:
    """The result an injected fault stands in for."""

    stderr: str = ""
    exit_status: int | None = None
    limit: str | None = None
    retry: bool = False  # the caller is told to retry after the plan's retry_after_s
    denial: str | None = None  # a denial with this reason rather than a failed run

    def apply(self, verdict: ToolResult, kind: FaultKind, retry_after_s: float) -> ToolResult:
        """``verdict`` (an allowed call's result before it ran) turned into this fault's."""
        if self.denial is not None:
            return verdict.model_copy(
                update={"allowed": False, "reason": self.denial, "fault": kind}
            )
        return verdict.model_copy(
            update={
                "fault": kind,
                "exit_status": self.exit_status,
                "stderr": self.stderr,
                "limit": self.limit,
                "retry_after_s": retry_after_s if self.retry else None,
            }
        )


FAULTS: dict[FaultKind, Injected] = {
    "timeout": Injected("killed: wall time limit", 137, "wall_time"),
    "rate_limit": Injected("rate limited; retry later", retry=True),
    "exception": Injected("RuntimeError: the tool failed unexpectedly", 1),
    "permission": Injected(denial="permission denied"),
    "exhaustion": Injected("killed: out of memory", 137, "memory"),
}
