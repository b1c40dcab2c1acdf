"""Routers judged on task families they never saw: leave-one-family-out, with bootstrap CIs.

For each family (``bench.router_split``: source/category), a classifier is trained on the
dev tasks of every other family and scored on the held-out family's *test* tasks; so no
test task is ever trained or tuned on, and no task of the held-out family is trained on.
Beside it, on the same tasks: the baselines (always full, always fast, the length
threshold, the rules alone), the **group lookup** (each task scored by the positive rate
of its group among the training tasks — source/category/difficulty when that group was
seen, else source/difficulty, else source, else all: on a held-out family only its coarser
groups can have been seen) and the classifier behind each rule of ``router.report.CHAINS``.

Figures per router: the mean over families of each family's AUC and APGR (families
without both labels have none; APGR's mean is weighted by the full tier's advantage in
each family, so that a family where the tiers differ by a hair cannot swing it — APGR
divides by that advantage) and the figures of all held-out predictions pooled (``pooled``: ranking across families too), each
with a 95% bootstrap interval (tasks resampled within each family) and, for the classifier,
the interval of its difference from the best baseline.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.router_plots import fine_group
from router.classifier import Classifier
from router.evaluation import auc, routing_curve
from router.report import BASELINES, CHAINS, forced_by_rules
from router.training import Example, fit

SCORE_BASELINES = ("always_full", "always_fast", "length_threshold", "rules")
NAMED_BASELINES = (*SCORE_BASELINES, "group_lookup")


def lookup_keys(ex: Example) -> list[str]:
    """The groups a task belongs to, most specific first."""
    source = ex.group.split("/")[0]
    keys = [fine_group(ex)]
    parts = ex.id.split("/")
    if parts[0] == "rg" and len(parts) > 2:
        keys.append(f"{source}/difficulty {parts[2]}")
    keys.extend((source, "all"))
    return keys


def group_lookup(train: Sequence[Example], test: Sequence[Example], margin: float) -> list[float]:
    rates: dict[str, list[int]] = defaultdict(list)
    for e in train:
        for key in lookup_keys(e):
            rates[key].append(e.label(margin))
    mean = {k: statistics.fmean(v) for k, v in rates.items()}
    return [next(mean[k] for k in lookup_keys(e) if k in mean) for e in test]


def router_scores(
    model: Classifier, train: Sequence[Example], test: Sequence[Example], margin: float
) -> dict[str, list[float]]:
    """Every router's score per test task (higher: more in need of the full tier)."""
    cls = [model.predict(e.body, e.session).probability for e in test]
    out = {"classifier": cls}
    for name, params in CHAINS.items():  # forced steps rank above every classifier score
        forced = forced_by_rules(test, params)
        out[name] = [p + float(f) for f, p in zip(forced, cls, strict=True)]
    for name in SCORE_BASELINES:
        out[name] = [BASELINES[name](e) for e in test]
    out["group_lookup"] = group_lookup(train, test, margin)
    return out


def _auc(scores: Sequence[float], examples: Sequence[Example], margin: float) -> float | None:
    labels = [e.label(margin) for e in examples]
    return auc(scores, labels) if 0 < sum(labels) < len(labels) else None


def _apgr(scores: Sequence[float], examples: Sequence[Example]) -> float | None:
    return _gap_apgr(scores, examples)[1]


def _gap_apgr(scores: Sequence[float], examples: Sequence[Example]) -> tuple[float, float | None]:
    """The full tier's mean advantage on these tasks, and the router's APGR (None when the
    full tier is no better)."""
    try:
        curve = routing_curve(scores, [e.full for e in examples], [e.fast for e in examples])
    except ValueError:
        return 0.0, None
    return curve.perf_strong - curve.perf_weak, curve.apgr()


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


@dataclass
class Held:
    """One held-out set (a family, or the whole test split) and every router's scores on it."""

    name: str
    examples: list[Example]
    scores: dict[str, list[float]]
    model: Classifier | None = None


Figures = dict[str, float | None]


def figures(held: Sequence[Held], router: str, margin: float, picks: Sequence[Sequence[int]] | None = None) -> Figures:  # fmt: skip
    """Macro (mean over sets) and pooled AUC/APGR of one router, on a resample ``picks``."""
    aucs: list[float | None] = []
    area = weight = 0.0
    pooled_s: list[float] = []
    pooled_e: list[Example] = []
    for i, h in enumerate(held):
        idx = picks[i] if picks is not None else range(len(h.examples))
        ex = [h.examples[j] for j in idx]
        sc = [h.scores[router][j] for j in idx]
        aucs.append(_auc(sc, ex, margin))
        gap, apgr = _gap_apgr(sc, ex)
        if apgr is not None and aucs[-1] is not None:  # both labels, and a gap to recover
            area += gap * apgr
            weight += gap
        pooled_s.extend(sc)
        pooled_e.extend(ex)
    return {"auc": _mean(aucs), "apgr": area / weight if weight else None,
            "auc_pooled": _auc(pooled_s, pooled_e, margin), "apgr_pooled": _apgr(pooled_s, pooled_e)}  # fmt: skip


def _ci(values: Sequence[float | None]) -> list[float] | None:
    kept = sorted(v for v in values if v is not None)
    if len(kept) < 10:
        return None
    lo, hi = kept[int(0.025 * (len(kept) - 1))], kept[int(0.975 * (len(kept) - 1))]
    return [round(lo, 4), round(hi, 4)]


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


@dataclass
class Evaluation:
    """Point figures, bootstrap intervals and per-set figures of every router."""

    routers: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_set: dict[str, dict[str, Figures]] = field(default_factory=dict)
    best_baseline: dict[str, Any] = field(default_factory=dict)


def evaluate(held: Sequence[Held], margin: float, boot: int, seed: int = 0) -> Evaluation:
    names = list(held[0].scores)
    rng = random.Random(seed)
    draws = [[[rng.randrange(len(h.examples)) for _ in h.examples] for h in held] for _ in range(boot)]  # fmt: skip
    out = Evaluation()
    resampled: dict[str, list[Figures]] = {}
    for name in names:
        point = figures(held, name, margin)
        resampled[name] = [figures(held, name, margin, picks) for picks in draws]
        row: dict[str, Any] = {k: _r(v) for k, v in point.items()}
        for key in point:
            row[f"{key}_ci"] = _ci([f[key] for f in resampled[name]])
        out.routers[name] = row
    for h in held:
        out.per_set[h.name] = {n: {k: _r(v) for k, v in figures([h], n, margin).items() if "pooled" not in k} for n in names}  # fmt: skip
    baselines = [n for n in NAMED_BASELINES if n in out.routers]
    for key in ("apgr", "apgr_pooled", "auc", "auc_pooled") if "classifier" in names else ():
        best = max(baselines, key=lambda n: out.routers[n][key] or 0.0)
        diffs = [_minus(c[key], b[key]) for c, b in zip(resampled["classifier"], resampled[best], strict=True)]  # fmt: skip
        out.best_baseline[key] = {
            "name": best, "value": out.routers[best][key],
            "classifier_minus_best": _r(_minus(out.routers["classifier"][key], out.routers[best][key])),
            "classifier_minus_best_ci": _ci(diffs),
        }  # fmt: skip
    return out


def base_rates(held: Sequence[Held], margin: float) -> dict[str, Any]:
    """Per held-out family: its share labelled 'needs full', the mean score the model that
    never saw it gives its tasks, and the share that model sends to full at its threshold;
    and the rank correlation (Spearman) of the first two over families: whether a model
    can tell which unseen family needs the full tier more."""
    rows = {}
    for h in held:
        scores = h.scores["classifier"]
        threshold = h.model.threshold if h.model is not None else 0.5
        rows[h.name] = {
            "needs_full": round(statistics.fmean(e.label(margin) for e in h.examples), 4),
            "mean_score": round(statistics.fmean(scores), 4),
            "to_full": round(statistics.fmean(float(p >= threshold) for p in scores), 4),
        }
    names = list(rows)

    def ranks(key: str) -> list[float]:
        values = [rows[n][key] for n in names]
        return [sum(1 for w in values if w < v) + (sum(1 for w in values if w == v) - 1) / 2 for v in values]  # fmt: skip

    a, b = ranks("needs_full"), ranks("mean_score")
    try:
        rho = statistics.correlation(a, b)
    except statistics.StatisticsError:  # fewer than two families, or constant ranks
        rho = float("nan")
    return {"families": rows, "spearman_needs_full_vs_score": round(rho, 4)}


def families(examples: Sequence[Example]) -> list[str]:
    return sorted({e.group for e in examples})


Trainer = Callable[[Sequence[Example]], Classifier]


def trainer(margin: float, l2: float, seed: int = 0, meta: Mapping[str, Any] | None = None) -> Trainer:  # fmt: skip
    return lambda train: Classifier(fit(train, margin=margin, l2_grid=(l2,), seed=seed, meta=meta))


def leave_one_family_out(
    train_pool: Sequence[Example], test_pool: Sequence[Example], train: Trainer, margin: float
) -> list[Held]:
    """For each family: a model trained on ``train_pool`` less that family, scored (with
    every other router) on that family's tasks in ``test_pool``."""
    held = []
    for fam in families(test_pool):
        seen = [e for e in train_pool if e.group != fam]
        unseen = [e for e in test_pool if e.group == fam]
        model = train(seen)
        held.append(Held(fam, unseen, router_scores(model, seen, unseen, margin), model))
    return held


def choose_margin(dev: Sequence[Example], margins: Sequence[float], l2: float) -> dict[str, Any]:
    """The label margin whose leave-one-family-out APGR *within the dev split* is highest
    (APGR reads the outcomes, not the labels, so margins compare fairly)."""
    tried = {}
    for margin in margins:
        held = leave_one_family_out(dev, dev, trainer(margin, l2), margin)
        tried[margin] = figures(held, "classifier", margin)
    best = max(margins, key=lambda m: (tried[m]["apgr"] or 0.0, -abs(m - 0.25)))
    return {"margin": best, "tried": {str(m): {k: _r(v) for k, v in f.items()} for m, f in tried.items()}}  # fmt: skip
