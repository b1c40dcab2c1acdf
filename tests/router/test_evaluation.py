"""AUC, PGR curves, APGR and CPT against values worked out by hand."""

from __future__ import annotations

import pytest

from router.evaluation import auc, routing_curve


def test_auc_known_values():
    assert auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5  # ties count half
    # one positive ranked below one of two negatives: 1 of 2 pairs is right
    assert auc([0.3, 0.1, 0.2], [0, 0, 1]) == 0.5


def test_auc_needs_both_classes():
    with pytest.raises(ValueError, match="both"):
        auc([0.1, 0.2], [1, 1])


def test_perfect_router_curve_and_apgr():
    # strong right on items 0, 1; weak right on item 1 only: only item 0 gains
    strong, weak = [1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]
    curve = routing_curve([0.9, 0.1, 0.2, 0.3], strong, weak)
    assert curve.perf_strong == 0.5 and curve.perf_weak == 0.25
    assert curve.cost == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert curve.pgr == (0.0, 1.0, 1.0, 1.0, 1.0)
    assert curve.apgr() == pytest.approx(0.875)  # 0.125 for the first step + 0.75
    assert curve.cpt(0.5) == pytest.approx(0.125)
    assert curve.cpt(1.0) == pytest.approx(0.25)


def test_constant_router_is_the_diagonal():
    strong, weak = [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]
    curve = routing_curve([0.5] * 4, strong, weak)
    assert curve.cost == (0.0, 1.0) and curve.pgr == (0.0, 1.0)
    assert curve.apgr() == pytest.approx(0.5)
    assert curve.cpt(0.8) == pytest.approx(0.8)
    assert curve.pgr_at(0.3) == pytest.approx(0.3)


def test_a_weak_tier_that_wins_has_no_pgr():
    with pytest.raises(ValueError, match="does not outperform"):
        routing_curve([0.1, 0.2], [0.0, 0.0], [1.0, 0.0])


def test_pgr_can_exceed_one_when_the_weak_tier_wins_some():
    strong, weak = [1.0, 0.0], [0.0, 0.5]
    curve = routing_curve([1.0, 0.0], strong, weak)  # send only item 0 to strong
    # mean score 0.75 against 0.25 (all weak) and 0.5 (all strong): PGR (0.75-0.25)/0.25
    assert curve.pgr[1] == pytest.approx(2.0)
