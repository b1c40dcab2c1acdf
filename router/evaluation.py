"""Offline router metrics: AUC, and RouteLLM's PGR / APGR / CPT (pure Python).

RouteLLM (Ong et al., 2024, arXiv 2406.18665) scores a router by sweeping its threshold:
at each share ``c`` of calls sent to the strong model, the performance gap recovered is

    PGR(c) = (perf(c) - perf(weak)) / (perf(strong) - perf(weak))

APGR is the area under PGR over ``c`` in [0, 1] and CPT(x%) the smallest ``c`` whose PGR
reaches x%. Here the strong model is the full tier and the weak one the fast tier, ``perf``
is the mean checked score of the tier each task was routed to, and the router's order is
its score (higher = more in need of the full tier). Tasks with equal scores move together
and the curve is interpolated across them, which is what a random tie-break gives in
expectation; so a constant router (always full, always fast) and a random one both have
APGR 0.5 and AUC 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties count half)."""
    if len(scores) != len(labels):
        raise ValueError("scores and labels differ in length")
    pos = sum(1 for y in labels if y)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    rank_sum = 0.0
    rank = 1
    for _, group in groupby(order, key=lambda i: scores[i]):
        members = list(group)
        mid = rank + (len(members) - 1) / 2.0  # average rank of a tie
        rank_sum += mid * sum(1 for i in members if labels[i])
        rank += len(members)
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


@dataclass(frozen=True, slots=True)
class Curve:
    """PGR at each share of calls to the strong tier (0 → 1), the knots of the sweep."""

    cost: tuple[float, ...]
    pgr: tuple[float, ...]
    perf_strong: float
    perf_weak: float

    def apgr(self) -> float:
        area = 0.0
        for i in range(1, len(self.cost)):
            area += (self.cost[i] - self.cost[i - 1]) * (self.pgr[i] + self.pgr[i - 1]) / 2.0
        return area

    def cpt(self, target: float) -> float:
        """The smallest share of strong calls at which PGR reaches ``target`` (0..1)."""
        for i, value in enumerate(self.pgr):
            if value >= target - 1e-12:
                if i == 0:
                    return 0.0
                c0, c1, p0 = self.cost[i - 1], self.cost[i], self.pgr[i - 1]
                return c0 + (c1 - c0) * (target - p0) / (value - p0)
        return 1.0

    def pgr_at(self, cost: float) -> float:
        for i in range(1, len(self.cost)):
            if cost <= self.cost[i]:
                c0, c1 = self.cost[i - 1], self.cost[i]
                t = 0.0 if c1 == c0 else (cost - c0) / (c1 - c0)
                return self.pgr[i - 1] + t * (self.pgr[i] - self.pgr[i - 1])
        return self.pgr[-1]


def routing_curve(scores: Sequence[float], strong: Sequence[float], weak: Sequence[float]) -> Curve:
    """Sweep the threshold from 'everything weak' to 'everything strong'."""
    n = len(scores)
    if n == 0 or not len(strong) == len(weak) == n:
        raise ValueError("scores, strong and weak outcomes must be non-empty and equal in length")
    perf_weak = sum(weak) / n
    perf_strong = sum(strong) / n
    gap = perf_strong - perf_weak
    if gap <= 0:
        raise ValueError(
            f"the strong tier does not outperform the weak one on these tasks "
            f"({perf_strong:.3f} vs {perf_weak:.3f}): PGR is undefined"
        )
    order = sorted(range(n), key=lambda i: -scores[i])
    cost, pgr = [0.0], [0.0]
    total = perf_weak * n
    moved = 0
    for _, group in groupby(order, key=lambda i: scores[i]):
        members = list(group)
        total += sum(strong[i] - weak[i] for i in members)
        moved += len(members)
        cost.append(moved / n)
        pgr.append((total / n - perf_weak) / gap)
    return Curve(tuple(cost), tuple(pgr), perf_strong, perf_weak)
