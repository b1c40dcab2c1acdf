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
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeAlias

from router.classifier import DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL, Classifier, Prediction
from router.policy import Check, Params, Policy, PolicyError, Probability, parse_params, register
from router.types import Decision, RouteRequest, Tier

Temperature: TypeAlias = Annotated[
    float, Check("a temperature between 0 and 2", lambda v: 0 <= v <= 2)
]


@dataclass(frozen=True, slots=True)
class ClassifierParams:
    """The classifier's parameters (module docstring); ``budget`` and ``load_aware`` take
    them too, beside their own. Whether the sampled model is on depends on which keys the
    configuration names, not on these values alone (``sampled_path``)."""

    model: str | None = None  # None or "": the shipped model
    threshold: Probability | None = None  # None: the model's own
    explore: Probability = 0.0
    sampled_model: str | None = None  # named as null: off; "": the shipped sampled model
    sampled_threshold: Probability | None = None  # None: the sampled model's own
    sampled_from: Temperature = 0.35
    default_temperature: Temperature = 1.0

    def __post_init__(self) -> None:
        if self.explore > 0.5:
            raise PolicyError("explore above 0.5 would invert the policy")


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
        prediction = model.predict(request.body, request.session, request.analysis.step)
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
            tier, reason, name, propensity, prediction.features, p, threshold, request.analysis
        )


def load_model(path: Path, policy: str, key: Literal["model", "sampled_model"]) -> Classifier:
    try:
        return Classifier.load(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise PolicyError(f"{policy}: cannot load the router model ({key}): {exc}") from None


def sampled_path(p: ClassifierParams, given: Collection[str]) -> Path | None:
    """The sampled-request model's file: the shipped one by default, or ``sampled_model``
    when the configuration names it; none when it names only ``model`` (a team's own model
    then scores every request) or ``sampled_model: null``. ``given``: the names it gave."""
    if "sampled_model" in given:
        return None if p.sampled_model is None else Path(p.sampled_model or DEFAULT_SAMPLED_MODEL)
    return None if "model" in given else DEFAULT_SAMPLED_MODEL


def build_classifier(
    p: ClassifierParams, given: Collection[str], policy: str = "classifier"
) -> ClassifierPolicy:
    """The classifier ``p`` describes (``given``: ``sampled_path``); PolicyError names
    ``policy`` when a model cannot be loaded."""
    sampled: Sampled | None = None
    path = sampled_path(p, given)
    if path is None and p.sampled_threshold is not None:
        raise PolicyError(f"{policy}: sampled_threshold needs a sampled_model")
    if path is not None:
        scorer = load_model(path, policy, "sampled_model")
        threshold = scorer.threshold if p.sampled_threshold is None else p.sampled_threshold
        sampled = Sampled(scorer, threshold, p.sampled_from, p.default_temperature)
    model = load_model(Path(p.model or DEFAULT_MODEL), policy, "model")
    threshold = model.threshold if p.threshold is None else p.threshold
    return ClassifierPolicy(model, threshold, p.explore, sampled=sampled)


@register("classifier")
def _build(params: Params) -> Policy:
    return build_classifier(parse_params(ClassifierParams, params, "classifier"), params)
