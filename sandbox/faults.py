"""Seeded fault injection, so that one sandbox can also serve as an RL environment."""

from __future__ import annotations

import random

from sandbox.protocol import FaultKind, FaultPlan


class Faults:
    def __init__(self, plan: FaultPlan | None) -> None:
        self.plan = plan
        self._rng = random.Random(plan.seed if plan else 0)
        self._calls = 0

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
