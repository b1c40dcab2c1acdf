"""Training the classifier from logged routing decisions (offline; needs numpy).

A logged step carries one tier's outcome only: the tier the policy chose, the probability it
gave that choice (propensity) and the reward the step earned. Which tier a step *needed* is
never observed directly, so the labels of ``router.training`` cannot be formed. Instead the
two-action case reduces to weighted classification (the offset trick of Beygelzimer and
Langford's offset tree, arXiv 0812.4044): with ``b`` the mean reward and the full tier's
reward lowered by ``cost`` (what a full-tier step must earn over a fast one to be worth it),

* a full-tier step that earned more than ``b`` says "full": label 1,
* a fast-tier step that earned more than ``b`` says "fast": label 0,
* a step that earned less says the other tier: the opposite label,

each weighted by ``|reward - b| / propensity``. Minimizing the weighted error is then
minimizing the regret of the routing rule, without bias as long as every tier had a chance on
every kind of step (the ``explore`` parameter of the classifier policy gives it).

The threshold is chosen like the full-information one: the highest whose routing recovers
``quality_target`` of the full tier's reward advantage, with rewards estimated from the log by
self-normalized inverse propensity scoring (``ips``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from router.classifier import Classifier
from router.training import DEFAULT_L2_GRID, FOLDS, Example, fit_labels
from router.types import Tier


@dataclass(frozen=True)
class Logged:
    id: str
    body: Mapping[str, Any]
    tier: Tier  # the tier the policy chose
    propensity: float  # the probability it gave that choice, in (0, 1]
    reward: float
    group: str = ""


@dataclass(frozen=True)
class Estimate:
    value: float  # self-normalized IPS estimate of the mean reward
    matched: int  # logged steps where the evaluated routing agrees with the log


def ips(logged: Sequence[Logged], full: np.ndarray) -> Estimate:
    """The mean reward routing ``full[i]`` (True: full tier) would have earned on the
    logged steps, from the steps where it agrees with the log, weighted 1/propensity."""
    chosen = np.array([s.tier is Tier.FULL for s in logged])
    agree = chosen == full
    w = np.array([1.0 / s.propensity for s in logged]) * agree
    r = np.array([s.reward for s in logged])
    total = float(w.sum())
    return Estimate(float((w * r).sum() / total) if total else float("nan"), int(agree.sum()))


def reduce(logged: Sequence[Logged], cost: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Labels (1: the full tier), weights and the baseline of the weighted-classification
    reduction (module docstring)."""
    reward = np.array([s.reward - (cost if s.tier is Tier.FULL else 0.0) for s in logged])
    baseline = float(reward.mean())
    full = np.array([s.tier is Tier.FULL for s in logged])
    better = reward > baseline
    y = np.where(full == better, 1.0, 0.0)
    weights = np.abs(reward - baseline) / np.array([s.propensity for s in logged])
    return y, weights, baseline


def check(logged: Sequence[Logged]) -> None:
    for s in logged:
        if not 0.0 < s.propensity <= 1.0:
            raise ValueError(f"step {s.id}: propensity {s.propensity} is not in (0, 1]")
    tiers = {s.tier for s in logged}
    if tiers != {Tier.FULL, Tier.FAST}:
        have = ", ".join(sorted(t.value for t in tiers)) or "none"
        raise ValueError(
            f"the log needs steps of both tiers to compare them (it has: {have}); "
            "let the policy explore (classifier param explore: 0.1)"
        )


def _by_rank(logged: Sequence[Logged], scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores from highest to lowest, and the IPS estimate of routing the first k of them
    (k = 0..n) to the full tier and the rest to the fast tier. Lowering the threshold past
    one more score sends that step to full, so every estimate comes from running sums."""
    full = np.array([s.tier is Tier.FULL for s in logged])
    w = np.array([1.0 / s.propensity for s in logged])
    wr = w * np.array([s.reward for s in logged])
    order = np.argsort(-scores, kind="stable")
    zero = np.zeros(1)
    # after the first k steps go full: the agreeing steps' weight and weighted reward
    num_full = np.concatenate([zero, np.cumsum((wr * full)[order])])
    den_full = np.concatenate([zero, np.cumsum((w * full)[order])])
    num_fast = np.concatenate([zero, np.cumsum((wr * ~full)[order])])
    den_fast = np.concatenate([zero, np.cumsum((w * ~full)[order])])
    num = num_full + (num_fast[-1] - num_fast)
    den = den_full + (den_fast[-1] - den_fast)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = num / den
    return scores[order], value


def tradeoff(
    logged: Sequence[Logged], scores: np.ndarray, shares: Sequence[float]
) -> list[dict[str, float]]:
    """For each target share of steps on the full tier: the threshold that gives it on the
    logged steps (ties make some shares unreachable: one row per share reached) and the mean
    reward that routing is estimated to earn."""
    ranked, value = _by_rank(logged, scores)
    n = len(ranked)
    rows: list[dict[str, float]] = []
    for share in shares:
        k = min(n, max(0, round(share * n)))
        threshold = float(ranked[k - 1]) if k else float(np.nextafter(ranked[0], np.inf))
        k = int((ranked >= threshold).sum())  # ties at the boundary go full together
        if not rows or rows[-1]["full_share"] != k / n:
            rows.append({"full_share": k / n, "threshold": threshold, "reward": float(value[k])})
    return rows


def choose_threshold(
    logged: Sequence[Logged], scores: np.ndarray, quality_target: float
) -> tuple[float, dict[str, float]]:
    """A threshold whose routing of the logged steps reaches ``quality_target`` of the full
    tier's estimated advantage over the fast tier with the fewest steps on full (placed
    midway between the last score routed full and the next); 1.0 (never full) when the
    full tier has no advantage.

    Lowering the threshold past one more score sends that step to the full tier, so the
    estimate of every threshold comes from running sums over the steps by falling score."""
    ranked, value = _by_rank(logged, scores)
    always_fast, always_full = float(value[0]), float(value[-1])
    figures = {"always_full": always_full, "always_fast": always_fast}
    if not always_full - always_fast > 0:
        return 1.0, figures
    target = always_fast + quality_target * (always_full - always_fast) - 1e-12
    for k in range(1, len(ranked) + 1):
        # a threshold can only fall between different scores
        if (k == len(ranked) or ranked[k] < ranked[k - 1]) and value[k] >= target:
            figures["routed"] = float(value[k])
            # midway to the next lower score: a new step scoring a hair below its training
            # twin (another number in the prompt) should still be routed like it
            lower = float(ranked[k]) if k < len(ranked) else 0.0
            return (float(ranked[k - 1]) + lower) / 2, figures
    return 0.0, figures  # not reached: k = n routes everything full


def effective_steps(logged: Sequence[Logged]) -> float:
    """Kish's effective sample size of the importance weights 1/propensity."""
    inv = np.array([1.0 / s.propensity for s in logged])
    return round(float(inv.sum() ** 2 / (inv**2).sum()), 1)


def evaluate(
    model: Classifier, logged: Sequence[Logged], threshold: float | None = None
) -> dict[str, Any]:
    """What routing the logged steps with ``model`` (at its threshold, or ``threshold``)
    would have earned per step, next to the logging policy and the two constant routers."""
    t = model.threshold if threshold is None else threshold
    scores = np.array([model.predict(s.body).probability for s in logged])
    routed = scores >= t
    n = len(logged)
    estimate = ips(logged, routed)
    return {
        "steps": n,
        "threshold": t,
        "full_share": float(routed.mean()),
        "model": estimate.value,
        "agreeing_steps": estimate.matched,
        "logged": float(np.mean([s.reward for s in logged])),
        "always_full": ips(logged, np.ones(n, dtype=bool)).value,
        "always_fast": ips(logged, np.zeros(n, dtype=bool)).value,
        "effective_steps": effective_steps(logged),
        "tradeoff": tradeoff(logged, scores, [i / 10 for i in range(11)]),
    }


def fit_logged(
    logged: Sequence[Logged],
    *,
    cost: float = 0.0,
    quality_target: float = 0.9,
    bits: int = 12,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    folds: int = FOLDS,
    seed: int = 0,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train on logged steps and return a model spec ``router.classifier`` loads."""
    check(logged)
    y, weights, baseline = reduce(logged, cost)
    if y.sum() < folds or (len(y) - y.sum()) < folds:
        raise ValueError(
            f"too few logged steps pointing each way to train ({int(y.sum())} towards the "
            f"full tier, {int(len(y) - y.sum())} towards the fast tier); log more steps"
        )
    if not weights.sum() > 0:
        raise ValueError("every logged step earned the same reward: nothing to learn from")
    examples = [Example(s.id, s.body, 0.0, 0.0, s.group) for s in logged]
    fitted = fit_labels(examples, y, weights, bits=bits, l2_grid=l2_grid, folds=folds, seed=seed)
    threshold, figures = choose_threshold(logged, fitted.train_scores, quality_target)
    propensities = np.array([s.propensity for s in logged])
    return {
        **fitted.spec,
        "label": f"logged reward, full tier's lowered by {cost}: weighted offset reduction",
        "threshold": threshold,
        "training": {
            "source": "logged steps",
            "steps": len(logged),
            "full_steps": int(sum(s.tier is Tier.FULL for s in logged)),
            "explored_steps": int((propensities < 1.0).sum()),
            "effective_steps": effective_steps(logged),
            "baseline_reward": round(baseline, 6),
            "ips": {k: round(v, 6) for k, v in figures.items()},
            "cost": cost,
            "l2": fitted.l2,
            "cv_weighted_log_likelihood": {str(k): round(v, 4) for k, v in fitted.cv.items()},
            "quality_target": quality_target,
            **dict(meta or {}),
        },
    }
