"""The trained classifier with a tunable threshold (``router.classifier``).

    router: {policy: classifier, params: {model: router/assets/classifier.json,
                                          threshold: 0.42, explore: 0.0}}

A step whose P(needs full) is at or above ``threshold`` (default: the one stored in the
model, chosen at training time to recover 90% of the full tier's quality) goes to the full
tier. ``explore`` sends that share of steps to the other tier, chosen by a hash of the
step (deterministic for a given request), and lowers the decision's propensity to match, so
that other policies can be evaluated offline from the recorded trajectories.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.classifier import DEFAULT_MODEL, Classifier, Prediction
from router.policy import Policy, PolicyError, register
from router.step_features import analyse_request
from router.types import Decision, RouteRequest, Tier


def _coin(request: RouteRequest, prediction: Prediction) -> float:
    """A deterministic number in [0, 1) for this step."""
    key = f"{request.session_id}|{prediction.features.get('messages')}|{prediction.probability:.9f}"
    return zlib.crc32(key.encode()) / 2**32


def explain(prediction: Prediction) -> str:
    return ", ".join(f"{name} {value:+.2f}" for name, value in prediction.top)


@dataclass(slots=True)
class ClassifierPolicy:
    model: Classifier
    threshold: float
    explore: float = 0.0
    name: str = "classifier"

    def score(self, request: RouteRequest) -> Prediction:
        return self.model.predict(request.body, request.session, analyse_request(request))

    def decide(self, request: RouteRequest) -> Decision:
        return self.decide_with(request, self.score(request), self.threshold, self.name, "")

    def decide_with(
        self, request: RouteRequest, prediction: Prediction, threshold: float, name: str, note: str
    ) -> Decision:
        p = prediction.probability
        tier = Tier.FULL if p >= threshold else Tier.FAST
        cmp = ">=" if tier is Tier.FULL else "<"
        reason = f"{name}: p(full)={p:.2f} {cmp} {threshold:.2f}{note}; top: {explain(prediction)}"
        propensity = 1.0
        if self.explore > 0.0:
            if _coin(request, prediction) < self.explore:
                tier = tier.other
                reason += f"; exploring ({self.explore:.0%} of steps)"
                propensity = self.explore
            else:
                propensity = 1.0 - self.explore
        return Decision(
            tier, reason, name, propensity, prediction.features, score=p, threshold=threshold
        )


def load_model(params: dict[str, Any], policy: str) -> Classifier:
    path = params.pop("model", None) or DEFAULT_MODEL
    try:
        return Classifier.load(Path(str(path)))
    except (ValueError, KeyError, TypeError) as exc:
        raise PolicyError(f"{policy}: cannot load the router model: {exc}") from None


def probability(params: dict[str, Any], key: str, default: float, policy: str) -> float:
    value = params.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise PolicyError(f"{policy}: {key} must be a number between 0 and 1, got {value!r}")
    return float(value)


def build_classifier(params: Mapping[str, Any], policy: str = "classifier") -> ClassifierPolicy:
    p = dict(params)
    model = load_model(p, policy)
    threshold = probability(p, "threshold", model.threshold, policy)
    explore = probability(p, "explore", 0.0, policy)
    if explore > 0.5:
        raise PolicyError(f"{policy}: explore above 0.5 would invert the policy")
    if p:
        raise PolicyError(
            f"{policy}: unknown parameters {sorted(p)}; known: model, threshold, explore"
        )
    return ClassifierPolicy(model, threshold, explore)


@register("classifier")
def _build(params: Mapping[str, Any]) -> Policy:
    return build_classifier(params)
