"""Training the complexity classifier (offline; needs numpy, never on the request path).

An example is a request body with the checked outcomes of both tiers on it. Its label is 1
("needs the full tier") when the full tier's score beats the fast tier's by more than
``margin`` (default 0.25): the steps where paying for the full tier buys quality. Steps both
tiers get right, or both get wrong, are 0: the full tier would not change the outcome there.
The margin ignores partial-credit differences (reasoning-gym gives 0.01 for a wrong answer in
the right form); on the evaluation set it raised held-out AUC from 0.80 to 0.83 and APGR
from 0.74 to 0.77 (mean of six splits, docs/router.md).

``fit`` standardizes the dense features, picks the L2 strength by stratified k-fold AUC,
fits a logistic regression by full-batch Adam on the log-loss, and writes the model spec
(``router.classifier``) with a default threshold: the lowest score threshold whose routing
reaches ``quality_target`` of the full tier's quality gap on the training examples.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from router.classifier import CLIP, DENSE, FORMAT, bucket, dense_features, ngrams
from router.evaluation import auc, routing_curve
from router.types import SessionState

DEFAULT_MARGIN = 0.25
DEFAULT_L2_GRID = (0.3, 0.1, 0.03, 0.01, 0.003)
FOLDS = 5  # cross-validation folds for choosing the L2 strength


@dataclass(frozen=True)
class Example:
    id: str
    body: Mapping[str, Any]
    full: float  # checked score of the full tier's answer, 0..1
    fast: float
    group: str = ""  # source/category, for stratified splits and reports
    session: SessionState | None = field(default=None, compare=False)

    def label(self, margin: float = DEFAULT_MARGIN) -> int:
        return int(self.full - self.fast > margin)


def split(
    examples: Sequence[Example], test_fraction: float = 0.3, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """A held-out split stratified by group, deterministic for a seed."""
    by_group: dict[str, list[Example]] = {}
    for ex in sorted(examples, key=lambda e: e.id):
        by_group.setdefault(ex.group, []).append(ex)
    rng = random.Random(seed)
    train: list[Example] = []
    test: list[Example] = []
    for group in sorted(by_group):
        members = by_group[group]
        rng.shuffle(members)
        cut = round(len(members) * test_fraction)
        test.extend(members[:cut])
        train.extend(members[cut:])
    return train, test


@dataclass(frozen=True)
class Design:
    """The training matrix: standardized dense features, hashed n-gram counts kept sparse
    (a request has tens of n-grams among thousands of buckets; coordinates and values), and a
    constant column for the bias, last. Memory and time grow with the n-grams, not with
    examples times buckets."""

    dense: np.ndarray  # (n, len(DENSE))
    rows: np.ndarray  # example of each n-gram entry
    cols: np.ndarray  # its bucket
    vals: np.ndarray  # its value (1/sqrt(n-grams of the example); repeats add up)
    width: int  # buckets: 1 << bits

    @property
    def n(self) -> int:
        return len(self.dense)

    @property
    def size(self) -> int:
        return int(self.dense.shape[1]) + self.width + 1

    def dot(self, w: np.ndarray) -> np.ndarray:
        d = self.dense.shape[1]
        hashed = np.bincount(self.rows, self.vals * w[d:-1][self.cols], minlength=self.n)
        out: np.ndarray = self.dense @ w[:d] + hashed + w[-1]
        return out

    def tdot(self, g: np.ndarray) -> np.ndarray:
        hashed = np.bincount(self.cols, self.vals * g[self.rows], minlength=self.width)
        return np.concatenate([self.dense.T @ g, hashed, [g.sum()]])

    def subset(self, mask: np.ndarray) -> Design:
        index = np.full(self.n, -1)
        index[mask] = np.arange(int(mask.sum()))
        keep = mask[self.rows]
        return Design(self.dense[mask], index[self.rows[keep]], self.cols[keep], self.vals[keep], self.width)  # fmt: skip


def featurize(examples: Sequence[Example], bits: int) -> Design:
    """The design with the dense features still raw (``fit_labels`` standardizes them)."""
    dense = np.array(
        [[dense_features(e.body, e.session)[0][k] for k in DENSE] for e in examples], dtype=float
    )
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for row, ex in enumerate(examples):
        grams = ngrams(ex.body)
        for gram in grams:
            rows.append(row)
            cols.append(bucket(gram, bits))
            vals.append(1.0 / np.sqrt(len(grams)))
    return Design(
        dense, np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), np.array(vals),
        1 << bits,
    )  # fmt: skip


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))
    return out


def _fit_lr(
    x: Design, y: np.ndarray, l2: float, steps: int = 600, weights: np.ndarray | None = None
) -> np.ndarray:
    """Weights (bias last) minimizing mean weighted log-loss + l2/2 |w|^2, by full-batch
    Adam; without ``weights`` the two classes weigh the same in total."""
    w = np.zeros(x.size)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    if weights is None:
        pos = max(1.0, float(y.sum()))
        neg = max(1.0, float(len(y) - y.sum()))
        sample_w = np.where(y > 0, len(y) / (2 * pos), len(y) / (2 * neg))  # balanced classes
    else:
        sample_w = weights * (len(weights) / weights.sum())
    for t in range(1, steps + 1):
        p = _sigmoid(x.dot(w))
        grad = x.tdot((p - y) * sample_w) / len(y)
        grad[:-1] += l2 * w[:-1]
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        w -= 0.05 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return w


@dataclass(frozen=True)
class Fitted:
    """A logistic regression over the router's features, before a threshold is chosen."""

    spec: dict[str, Any]  # format, hash bits, weights, standardization
    train_scores: np.ndarray  # P(label 1) of each training example
    l2: float
    cv: dict[float, float]  # L2 strength -> cross-validated criterion (higher is better)


def fit_labels(
    examples: Sequence[Example],
    y: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    bits: int = 12,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    folds: int = FOLDS,
    seed: int = 0,
) -> Fitted:
    """Fit on given 0/1 labels. Unweighted: classes balanced, L2 strength by stratified
    k-fold AUC. Weighted (``weights`` per example, e.g. importance weights of logged
    steps): L2 strength by k-fold weighted log-likelihood."""
    raw = featurize(examples, bits)
    mean = raw.dense.mean(axis=0)
    scale = raw.dense.std(axis=0)
    scale[scale < 1e-9] = 1.0
    x = replace(raw, dense=np.clip((raw.dense - mean) / scale, -CLIP, CLIP))

    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(y), dtype=int)
    for cls in (0.0, 1.0):  # stratified folds
        idx = np.flatnonzero(y == cls)
        rng.shuffle(idx)
        fold_of[idx] = np.arange(len(idx)) % folds
    cv: dict[float, float] = {}
    for l2 in l2_grid if len(l2_grid) > 1 else ():  # one strength: nothing to choose
        scores = np.zeros(len(y))
        for k in range(folds):
            train = fold_of != k
            part = None if weights is None else weights[train]
            w = _fit_lr(x.subset(train), y[train], l2, weights=part)
            scores[~train] = _sigmoid(x.subset(~train).dot(w))
        if weights is None:
            cv[l2] = auc(scores.tolist(), y.astype(int).tolist())
        else:
            p = np.clip(scores, 1e-6, 1 - 1e-6)
            ll = y * np.log(p) + (1 - y) * np.log(1 - p)
            cv[l2] = float((weights * ll).sum() / weights.sum())
    best = max(l2_grid, key=lambda l2: (round(cv.get(l2, 0.0), 4), l2))  # ties: stronger prior
    w = _fit_lr(x, y, best, weights=weights)
    d = len(DENSE)
    spec = {
        "format": FORMAT,
        "hash_bits": bits,
        "bias": float(w[-1]),
        "dense_weights": {k: round(float(w[i]), 6) for i, k in enumerate(DENSE)},
        "dense_mean": {k: round(float(mean[i]), 6) for i, k in enumerate(DENSE)},
        "dense_scale": {k: round(float(scale[i]), 6) for i, k in enumerate(DENSE)},
        "hashed_weights": {
            str(i): round(float(w[d + i]), 6) for i in range(1 << bits) if abs(w[d + i]) > 1e-4
        },
    }
    return Fitted(spec, _sigmoid(x.dot(w)), best, cv)


def fit(
    examples: Sequence[Example],
    *,
    bits: int = 12,
    margin: float = DEFAULT_MARGIN,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    folds: int = FOLDS,
    quality_target: float = 0.9,
    seed: int = 0,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train on ``examples`` and return the model spec ``router.classifier`` loads."""
    y = np.array([e.label(margin) for e in examples], dtype=float)
    if y.sum() < folds or (len(y) - y.sum()) < folds:
        raise ValueError(
            f"too few examples of one class to train ({int(y.sum())} need the full tier, "
            f"{int(len(y) - y.sum())} do not); collect more outcomes"
        )
    fitted = fit_labels(examples, y, bits=bits, l2_grid=l2_grid, folds=folds, seed=seed)
    threshold = _threshold_for(fitted.train_scores, examples, quality_target)
    return {
        **fitted.spec,
        "label": f"full score - fast score > {margin}",
        "threshold": threshold,  # not rounded: rounding up would exclude the step it came from
        "training": {
            "examples": len(examples),
            "positives": int(y.sum()),
            "l2": fitted.l2,
            "cv_auc": {str(k): round(v, 4) for k, v in fitted.cv.items()},
            "quality_target": quality_target,
            **dict(meta or {}),
        },
    }


def _threshold_for(scores: np.ndarray, examples: Sequence[Example], target: float) -> float:
    """The highest threshold (fewest full-tier calls) whose PGR reaches ``target``."""
    strong = [e.full for e in examples]
    weak = [e.fast for e in examples]
    try:
        curve = routing_curve(scores.tolist(), strong, weak)
    except ValueError:
        return 0.5
    share = curve.cpt(target)
    ranked = np.sort(scores)[::-1]
    k = int(np.ceil(share * len(ranked)))
    if k <= 0:
        return float(ranked[0]) + 1e-6
    return float(ranked[min(k, len(ranked)) - 1])
