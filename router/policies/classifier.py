"""The trained classifier with a tunable threshold (``router.classifier``).

    router: {policy: classifier, params: {model: router/assets/classifier.json,
                                          threshold: 0.42, explore: 0.0,
                                          sampled_model: router/assets/classifier-sampled.json,
                                          sampled_threshold: 0.27, sampled_from: 0.35,
                                          default_temperature: 1.0}}

A step whose P(needs full) is at or above ``threshold`` (default: the one stored in the
model, chosen at training time to recover 90% of the full tier's quality) goes to the full
tier. ``explore`` sends that share of steps to the other tier, chosen by a hash of the
step (deterministic for a given request), and lowers the decision's propensity to match, so
that other policies can be evaluated offline from the recorded trajectories.

Whether the fast tier will do depends on how the request samples: a pruned model loses
more to sampling than the full one (docs/router.md). A request whose ``temperature`` is at
least ``sampled_from`` (a request without one samples at ``default_temperature``, vLLM's
default when the model's generation config names none) is scored by ``sampled_model``,
trained on sampled outcomes, with its own threshold; the rest by ``model``, trained on
greedy ones. With the shipped models both are on by default; naming only ``model`` uses
that one for every request, and ``sampled_model: null`` turns the split off.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from router.classifier import DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL, Classifier, Prediction
from router.policy import Policy, PolicyError, register
from router.step_features import analyse_request
from router.types import Decision, RouteRequest, Tier


def _coin(request: RouteRequest, prediction: Prediction) -> float:
    """A deterministic number in [0, 1) for this step."""
    key = f"{request.session_id}|{prediction.features.get('messages')}|{prediction.probability:.9f}"
    return zlib.crc32(key.encode()) / 2**32


def explain(prediction: Prediction) -> str:
    return ", ".join(f"{name} {value:+.2f}" for name, value in prediction.top)


@dataclass(frozen=True, slots=True)
class Sampled:
    """The model for requests that sample, and when a request counts as sampling."""

    model: Classifier
    threshold: float
    sampled_from: float = 0.35
    default_temperature: float = 1.0

    def applies(self, body: Mapping[str, Any]) -> float | None:
        """The request's temperature when this model scores it, else None."""
        t = body.get("temperature")
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            t = self.default_temperature
        return float(t) if t >= self.sampled_from else None


class Scored(NamedTuple):
    prediction: Prediction
    threshold: float  # the scoring model's own (or the configured one)
    regime: str  # "" for greedy requests, "sampled T=…" when the sampled model scored it


@dataclass(slots=True)
class ClassifierPolicy:
    model: Classifier
    threshold: float
    explore: float = 0.0
    name: str = "classifier"
    sampled: Sampled | None = None

    def parts(self) -> tuple[object, ...]:
        return (self.model,) if self.sampled is None else (self.model, self.sampled.model)

    def score(self, request: RouteRequest) -> Scored:
        """The request scored by the model for its regime, with that model's threshold."""
        model, threshold, regime = self.model, self.threshold, ""
        if self.sampled is not None:
            temperature = self.sampled.applies(request.body)
            if temperature is not None:
                model, threshold = self.sampled.model, self.sampled.threshold
                regime = f"sampled T={temperature:g}"
        prediction = model.predict(request.body, request.session, analyse_request(request))
        return Scored(prediction, threshold, regime)

    def decide(self, request: RouteRequest) -> Decision:
        scored = self.score(request)
        return self.decide_with(request, scored, scored.threshold, self.name, "")

    def decide_with(
        self, request: RouteRequest, scored: Scored, threshold: float, name: str, note: str
    ) -> Decision:
        prediction = scored.prediction
        if scored.regime:
            note = f" ({scored.regime}){note}"
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


def load_model(params: dict[str, Any], policy: str, key: str = "model") -> Classifier:
    path = params.pop(key, None) or (DEFAULT_MODEL if key == "model" else DEFAULT_SAMPLED_MODEL)
    try:
        return Classifier.load(Path(str(path)))
    except (ValueError, KeyError, TypeError) as exc:
        raise PolicyError(f"{policy}: cannot load the router model ({key}): {exc}") from None


def _temperature(params: dict[str, Any], key: str, default: float, policy: str) -> float:
    value = params.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise PolicyError(f"{policy}: {key} must be a temperature between 0 and 2, got {value!r}")
    return float(value)


def load_sampled(params: dict[str, Any], policy: str) -> Sampled | None:
    """The sampled-request model: on with the shipped models, or when ``sampled_model`` is
    named; off when only ``model`` is named or ``sampled_model`` is null."""
    own_model = "model" in params
    wanted = params.get("sampled_model", None if own_model else DEFAULT_SAMPLED_MODEL)
    sampled_from = _temperature(params, "sampled_from", 0.35, policy)
    default_temperature = _temperature(params, "default_temperature", 1.0, policy)
    if wanted is None:
        params.pop("sampled_model", None)
        if "sampled_threshold" in params:
            raise PolicyError(f"{policy}: sampled_threshold needs a sampled_model")
        return None
    params["sampled_model"] = wanted
    model = load_model(params, policy, "sampled_model")
    threshold = probability(params, "sampled_threshold", model.threshold, policy)
    return Sampled(model, threshold, sampled_from, default_temperature)


def probability(params: dict[str, Any], key: str, default: float, policy: str) -> float:
    value = params.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise PolicyError(f"{policy}: {key} must be a number between 0 and 1, got {value!r}")
    return float(value)


def build_classifier(params: Mapping[str, Any], policy: str = "classifier") -> ClassifierPolicy:
    p = dict(params)
    sampled = load_sampled(p, policy)
    model = load_model(p, policy)
    threshold = probability(p, "threshold", model.threshold, policy)
    explore = probability(p, "explore", 0.0, policy)
    if explore > 0.5:
        raise PolicyError(f"{policy}: explore above 0.5 would invert the policy")
    if p:
        raise PolicyError(
            f"{policy}: unknown parameters {sorted(p)}; known: model, threshold, explore, "
            "sampled_model, sampled_threshold, sampled_from, default_temperature"
        )
    return ClassifierPolicy(model, threshold, explore, sampled=sampled)


@register("classifier")
def _build(params: Mapping[str, Any]) -> Policy:
    return build_classifier(params)
