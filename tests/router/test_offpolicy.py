"""Training the router from logged steps: the reduction, the estimates, and that it learns."""

from __future__ import annotations

import random

import numpy as np
import pytest

from router.classifier import Classifier
from router.offpolicy import (
    Logged,
    choose_threshold,
    evaluate,
    fit_logged,
    ips,
    reduce,
    tradeoff,
)
from router.types import Tier

FULL, FAST = Tier.FULL, Tier.FAST


def step(tier: Tier, reward: float, propensity: float = 0.5, text: str = "x") -> Logged:
    body = {"messages": [{"role": "user", "content": text}]}
    return Logged(f"{text}-{tier.value}-{reward}", body, tier, propensity, reward)


def test_reduction_labels_point_to_the_tier_that_did_better_than_the_mean():
    log = [step(FULL, 1.0, 0.8), step(FULL, 0.0, 0.2), step(FAST, 1.0, 0.5), step(FAST, 0.0, 0.25)]
    y, w, baseline = reduce(log, cost=0.0)
    assert baseline == 0.5
    # full won: full; full lost: fast; fast won: fast; fast lost: full
    assert y.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert w.tolist() == pytest.approx([0.5 / 0.8, 0.5 / 0.2, 0.5 / 0.5, 0.5 / 0.25])
    # the full tier's cost lowers its rewards before the comparison
    y, _, baseline = reduce([step(FULL, 1.0), step(FAST, 0.9)], cost=0.2)
    assert baseline == pytest.approx(0.85) and y.tolist() == [0.0, 0.0]


def test_ips_reweights_the_agreeing_steps():
    log = [step(FULL, 1.0, 0.5), step(FAST, 0.0, 0.25), step(FAST, 1.0, 1.0)]
    everything_full = ips(log, np.array([True, True, True]))
    assert everything_full.value == 1.0 and everything_full.matched == 1
    # agreeing steps 2 and 3 weigh 4 and 1
    assert ips(log, np.array([True, False, False])).value == pytest.approx(
        (2 * 1 + 4 * 0 + 1 * 1) / 7
    )
    assert np.isnan(ips(log[:1], np.array([False])).value)


def test_no_advantage_for_the_full_tier_means_never_full():
    log = [step(FULL, 0.0), step(FAST, 1.0), step(FULL, 0.5), step(FAST, 0.5)]
    threshold, figures = choose_threshold(log, np.array([0.9, 0.1, 0.8, 0.2]), 0.9)
    assert threshold == 1.0 and figures["always_fast"] > figures["always_full"]


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ([step(FULL, 1.0), step(FULL, 0.0)], "needs steps of both tiers"),
        ([step(FULL, 1.0, 0.0), step(FAST, 0.0)], "propensity 0.0 is not in"),
        ([step(FULL, 1.0), step(FAST, 1.0)] * 6, "every logged step earned the same reward"),
        ([step(FULL, 1.0), step(FAST, 0.0)] * 2, "too few logged steps pointing each way"),
    ],
)
def test_logs_it_cannot_learn_from_are_refused(log, message):
    with pytest.raises(ValueError, match=message):
        fit_logged(log)


def synthetic_log(n: int, explore: float, seed: int) -> list[Logged]:
    """Arithmetic questions need the full tier (it answers them, the fast tier does not);
    chit-chat both answer. The logging policy sends everything fast but explores."""
    rng = random.Random(seed)
    log = []
    for i in range(n):
        hard = rng.random() < 0.4
        text = f"compute {i} * {i + 7} - 3 exactly" if hard else f"say hello to friend number {i}"
        flip = rng.random() < explore
        tier = FULL if flip else FAST
        reward = 1.0 if (tier is FULL or not hard) else 0.0
        log.append(step(tier, reward, explore if flip else 1 - explore, text))
    return log


def test_it_learns_which_steps_need_the_full_tier_from_exploration_alone():
    log = synthetic_log(400, explore=0.3, seed=1)
    spec = fit_logged(log, cost=0.1, bits=8, l2_grid=(0.03, 0.003), folds=3, meta={"from": "test"})
    model = Classifier(spec)
    hard = model.predict(
        {"messages": [{"role": "user", "content": "compute 900 * 907 - 3 exactly"}]}
    )
    easy = model.predict(
        {"messages": [{"role": "user", "content": "say hello to friend number 900"}]}
    )
    assert hard.probability >= spec["threshold"] > easy.probability
    t = spec["training"]
    assert t["steps"] == 400 and t["explored_steps"] == 400 and t["full_steps"] > 50
    assert t["ips"]["always_full"] == pytest.approx(1.0) and t["ips"]["always_fast"] < 0.75
    assert (
        t["ips"]["routed"] >= t["ips"]["always_fast"] + 0.9 * (1.0 - t["ips"]["always_fast"]) - 1e-9
    )
    assert 0 < t["effective_steps"] < 400 and t["from"] == "test"
    assert set(t["cv_weighted_log_likelihood"]) == {"0.03", "0.003"}
    again = fit_logged(log, cost=0.1, bits=8, l2_grid=(0.03, 0.003), folds=3, meta={"from": "test"})
    assert again == spec  # deterministic


def test_threshold_search_matches_evaluating_every_threshold():
    rng = random.Random(3)
    tiers = [rng.choice([FULL, FAST]) for _ in range(200)]
    log = [step(t, rng.choice([0.5, 1.0] if t is FULL else [0.0, 0.5, 1.0]), rng.choice([0.1, 0.9]))
           for t in tiers]  # fmt: skip
    scores = np.array([round(rng.random(), 2) for _ in log])  # ties on purpose
    threshold, figures = choose_threshold(log, scores, 0.8)
    n = len(log)
    full, fast = ips(log, np.ones(n, dtype=bool)).value, ips(log, np.zeros(n, dtype=bool)).value
    assert (figures["always_full"], figures["always_fast"]) == pytest.approx((full, fast))
    reaching = [t for t in sorted(set(scores.tolist()), reverse=True)
                if ips(log, scores >= t).value >= fast + 0.8 * (full - fast) - 1e-12]  # fmt: skip
    assert full > fast and ((scores >= threshold) == (scores >= reaching[0])).all()
    below = max(x for x in scores.tolist() if x < reaching[0])
    assert threshold == pytest.approx((reaching[0] + below) / 2)  # midway to the next score
    assert figures["routed"] == pytest.approx(ips(log, scores >= threshold).value)


def test_evaluate_estimates_a_model_on_a_fresh_log():
    spec = fit_logged(synthetic_log(400, 0.3, seed=1), bits=8, l2_grid=(0.01,))
    fresh = synthetic_log(300, 0.3, seed=2)
    report = evaluate(Classifier(spec), fresh)
    assert report["steps"] == 300 and report["threshold"] == spec["threshold"]
    assert report["logged"] == pytest.approx(np.mean([s.reward for s in fresh]))
    # the model sends the hard ~40% to full: the reward of always-full at a lower full share
    assert report["model"] == pytest.approx(report["always_full"]) == pytest.approx(1.0)
    assert 0.3 < report["full_share"] < 0.5 and report["always_fast"] < 0.75
    never = evaluate(Classifier(spec), fresh, threshold=1.01)
    assert never["full_share"] == 0.0 and never["model"] == pytest.approx(never["always_fast"])


def test_tradeoff_rows_are_the_estimates_of_their_thresholds():
    rng = random.Random(5)
    log = [step(rng.choice([FULL, FAST]), rng.random(), rng.choice([0.2, 0.8])) for _ in range(120)]
    scores = np.array([round(rng.random(), 1) for _ in log])  # many ties
    rows = tradeoff(log, scores, [0.0, 0.25, 0.5, 1.0])
    n = len(log)
    assert rows[0]["full_share"] == 0.0 and rows[-1]["full_share"] == 1.0
    assert rows[0]["reward"] == pytest.approx(ips(log, np.zeros(n, dtype=bool)).value)
    for row in rows:
        routed = scores >= row["threshold"]
        assert row["full_share"] == routed.mean()
        assert row["reward"] == pytest.approx(ips(log, routed).value)
    assert [r["full_share"] for r in rows] == sorted(r["full_share"] for r in rows)
