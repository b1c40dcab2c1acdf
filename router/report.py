"""A classifier and the baselines on the same labelled examples: AUC, APGR, CPT.

Baselines (LLMRouterBench found many routers fail to beat them; REFERENCES.md): always
full, always fast, random (expected values over ``random_draws`` seeded draws), the length
threshold (score: estimated prompt tokens) and the rules policy (score: 1 for code, math,
high effort or a failed tool call). Every router is a score per example; the threshold
sweep of ``router.evaluation`` turns it into PGR at every share of full-tier calls.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.classifier import Classifier
from router.evaluation import auc, routing_curve
from router.policy import build_policy
from router.step_features import step_features
from router.tokens import estimate_prompt_tokens
from router.training import DEFAULT_MARGIN, Example
from router.types import RouteRequest


def _rules_score(ex: Example) -> float:
    f = step_features(ex.body)
    return float(f["code"] or f["math"] or f["reasoning_effort"] >= 2 or f["last_tool_error"])


BASELINES: dict[str, Callable[[Example], float]] = {
    "always_full": lambda ex: 1.0,
    "always_fast": lambda ex: 0.0,
    "length_threshold": lambda ex: float(estimate_prompt_tokens(ex.body)),
    "rules": _rules_score,
}


def metrics(
    scores: Sequence[float], examples: Sequence[Example], margin: float = DEFAULT_MARGIN
) -> dict[str, float]:
    labels = [ex.label(margin) for ex in examples]
    curve = routing_curve(scores, [ex.full for ex in examples], [ex.fast for ex in examples])
    return {
        "auc": round(auc(scores, labels), 4),
        "apgr": round(curve.apgr(), 4),
        "cpt50": round(curve.cpt(0.5), 4),
        "cpt80": round(curve.cpt(0.8), 4),
    }


def forced_by_rules(examples: Sequence[Example], params: Mapping[str, Any]) -> list[bool]:
    """Whether the rules policy (with these parameters) forces the full tier, per example."""
    policy = build_policy("rules", {**params, "base": "always_fast"})
    return [policy.decide(RouteRequest("chat", ex.body)).policy == "rules" for ex in examples]


_OFF = {"risky_tools": False, "tool_call": False, "code": False, "math": False, "effort": False,
        "tool_error": False}  # fmt: skip
# rules in front of the classifier, as a deployment may compose them (docs/router.md): the
# default chain's rules (a forced call, high effort, a failed tool call), every rule
# (risky tools merely offered, code and math too), and each rule alone, to judge it
CHAINS: dict[str, dict[str, Any]] = {
    "default_rules+classifier": {"code": False, "math": False},
    "rules_all+classifier": {"risky_offered": True},
    "rule_risky_forced+classifier": {**_OFF, "risky_tools": True},
    "rule_risky_offered+classifier": {**_OFF, "risky_tools": True, "risky_offered": True},
    "rule_tool_call+classifier": {**_OFF, "tool_call": True},
    "rule_code+classifier": {**_OFF, "code": True},
    "rule_math+classifier": {**_OFF, "math": True},
    "rule_effort+classifier": {**_OFF, "effort": True},
    "rule_tool_error+classifier": {**_OFF, "tool_error": True},
}


def compare(
    model: Classifier,
    examples: Sequence[Example],
    margin: float = DEFAULT_MARGIN,
    seed: int = 0,
    random_draws: int = 200,
) -> dict[str, Any]:
    """Figures for the classifier, each baseline, rules in front of the classifier, and the
    classifier at its threshold."""
    out: dict[str, Any] = {}
    scores = [model.predict(ex.body, ex.session).probability for ex in examples]
    out["classifier"] = metrics(scores, examples, margin)
    for name, params in CHAINS.items():  # forced steps rank above every classifier score
        forced = forced_by_rules(examples, params)
        chained = [p + float(f) for f, p in zip(forced, scores, strict=True)]
        out[name] = metrics(chained, examples, margin)
        out[name]["forced_share"] = round(sum(1 for c in chained if c >= 1.0) / len(chained), 4)
    for name, score in BASELINES.items():
        out[name] = metrics([score(ex) for ex in examples], examples, margin)
    rng = random.Random(seed)
    draws = [
        metrics([rng.random() for _ in examples], examples, margin) for _ in range(random_draws)
    ]
    out["random"] = {k: round(statistics.fmean(d[k] for d in draws), 4) for k in draws[0]}
    to_full = [s >= model.threshold for s in scores]
    n = len(examples)
    quality = sum(ex.full if f else ex.fast for ex, f in zip(examples, to_full, strict=True)) / n
    perf_full = sum(ex.full for ex in examples) / n
    perf_fast = sum(ex.fast for ex in examples) / n
    out["at_threshold"] = {
        "threshold": model.threshold,
        "full_share": round(sum(to_full) / n, 4),
        "quality": round(quality, 4),
        "pgr": round((quality - perf_fast) / (perf_full - perf_fast), 4),
    }
    out["tiers"] = {"full": round(perf_full, 4), "fast": round(perf_fast, 4), "examples": n,
                    "positives": sum(ex.label(margin) for ex in examples)}  # fmt: skip
    return out


def best_baseline(report: dict[str, Any], key: str = "apgr") -> tuple[str, float]:
    names = [*BASELINES, "random"]
    best = max(names, key=lambda name: report[name][key])
    return best, report[best][key]
