"""The classifier's threshold shifted by the tiers' load and the fast tier's acceptance rate.

    router: {policy: load_aware, params: {shift: 0.2, queue_scale: 4,
                                          min_acceptance: 0.3, model: ..., threshold: ...}}

When the full tier's replicas have more requests queued or running than the fast tier's,
borderline steps move to the fast tier: the threshold rises by up to ``shift`` as the
difference per replica approaches ``queue_scale``, and falls the same way when the fast
tier is the busier one. When the fast tier's speculative decoding accepts fewer than
``min_acceptance`` of its drafts, its speed advantage is gone and the threshold falls by
``shift``. Load comes from the gateway (``RouteRequest.load``); without it, this is the
plain classifier.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.policies.classifier import ClassifierParams, ClassifierPolicy, build_classifier
from router.policy import Params, Policy, PositiveFloat, Probability, parse_params, register
from router.types import Decision, LoadSignals, RouteRequest, Tier


@dataclass(frozen=True, slots=True)
class LoadAwareParams(ClassifierParams):
    """The classifier's parameters and the shift's own (module docstring)."""

    shift: Probability = 0.2
    queue_scale: PositiveFloat = 4.0
    min_acceptance: Probability = 0.3


@dataclass(frozen=True, slots=True)
class LoadAware:
    scorer: ClassifierPolicy
    shift: float = 0.2
    queue_scale: float = 4.0
    min_acceptance: float = 0.3
    name: str = "load_aware"

    def adjust(self, load: LoadSignals | None, threshold: float) -> tuple[float, str]:
        if load is None:
            return threshold, ""
        notes = []
        full = load.queue_per_replica.get(Tier.FULL, 0.0)
        fast = load.queue_per_replica.get(Tier.FAST, 0.0)
        pressure = max(-1.0, min(1.0, (full - fast) / self.queue_scale))
        if pressure:
            threshold += self.shift * pressure
            notes.append(f"queues full {full:.1f} / fast {fast:.1f} per replica")
        rate = load.acceptance_rate.get(Tier.FAST)
        if rate is not None and rate < self.min_acceptance:
            threshold -= self.shift
            notes.append(f"fast-tier acceptance {rate:.2f} < {self.min_acceptance:.2f}")
        threshold = max(0.0, min(1.0, threshold))
        return threshold, (f" (adjusted: {'; '.join(notes)})" if notes else "")

    def parts(self) -> tuple[object, ...]:
        return (self.scorer,)

    def decide(self, request: RouteRequest) -> Decision:
        scored = self.scorer.score(request)
        threshold, note = self.adjust(request.load, scored.threshold)
        return self.scorer.decide_with(request, scored, threshold, self.name, note)


@register("load_aware")
def _build(params: Params) -> Policy:
    p = parse_params(LoadAwareParams, params, "load_aware")
    scorer = build_classifier(p, params, "load_aware")
    return LoadAware(scorer, p.shift, p.queue_scale, p.min_acceptance)
