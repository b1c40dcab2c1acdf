"""A target share of fast-tier steps: the classifier's threshold follows recent traffic.

    router: {policy: budget, params: {fast_share: 0.7, window: 1000, model: ..., explore: 0}}

The policy keeps the classifier scores of the last ``window`` routed steps and sets the
threshold to their ``fast_share`` quantile, so that about that share of steps goes to the
fast tier whatever the traffic mix, and the steps sent to full are still the ones the
classifier ranks as hardest. Until ``min_samples`` scores are in, the model's own threshold
applies. Decisions depend on the order of earlier requests (deterministic for a sequence).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from router.policies.classifier import ClassifierParams, ClassifierPolicy, build_classifier
from router.policy import (
    Params,
    Policy,
    PolicyError,
    PositiveInt,
    Probability,
    parse_params,
    register,
)
from router.types import Decision, RouteRequest


@dataclass(frozen=True, slots=True)
class BudgetParams(ClassifierParams):
    """The classifier's parameters and the budget's own (module docstring)."""

    fast_share: Probability = 0.7
    window: PositiveInt = 1000
    min_samples: PositiveInt = 50

    def __post_init__(self) -> None:
        ClassifierParams.__post_init__(self)
        if self.min_samples > self.window:
            raise PolicyError("min_samples cannot exceed window")


@dataclass(slots=True)
class Window:
    """The last ``size`` scores, kept sorted for the quantile."""

    size: int
    recent: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        return self.ordered[min(len(self.ordered) - 1, int(q * len(self.ordered)))]

    def observe(self, score: float) -> None:
        self.recent.append(score)
        bisect.insort(self.ordered, score)
        if len(self.recent) > self.size:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]


@dataclass(slots=True)
class Budget:
    """One window per scoring model (greedy and sampled requests are scored by different
    models, whose scores are not on one scale); each holds the target share."""

    scorer: ClassifierPolicy
    fast_share: float
    window: int = 1000
    min_samples: int = 50
    name: str = "budget"
    _windows: dict[bool, Window] = field(default_factory=dict)

    def parts(self) -> tuple[object, ...]:
        return (self.scorer,)

    def decide(self, request: RouteRequest) -> Decision:
        scored = self.scorer.score(request)
        window = self._windows.get(bool(scored.regime))
        if window is None:
            window = self._windows[bool(scored.regime)] = Window(self.window)
        if len(window.ordered) < self.min_samples:
            threshold = scored.threshold
        else:
            threshold = window.quantile(self.fast_share)
        window.observe(scored.prediction.probability)
        note = f" (fast share target {self.fast_share:.0%} over {len(window.recent)} steps)"
        return self.scorer.decide_with(request, scored, threshold, self.name, note)


@register("budget")
def _build(params: Params) -> Policy:
    p = parse_params(BudgetParams, params, "budget")
    return Budget(build_classifier(p, params, "budget"), p.fast_share, p.window, p.min_samples)
