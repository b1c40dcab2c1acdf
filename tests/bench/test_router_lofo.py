"""Leave-one-family-out evaluation: what is trained on, the group lookup, the figures."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bench.router_lofo import (
    Held,
    base_rates,
    evaluate,
    figures,
    group_lookup,
    leave_one_family_out,
    lookup_keys,
    router_scores,
)  # fmt: skip
from router.classifier import Classifier
from router.training import Example, fit


def ex(task_id: str, group: str, full: float, fast: float, text: str = "hi") -> Example:
    return Example(task_id, {"messages": [{"role": "user", "content": text}]}, full, fast, group)


def test_lookup_falls_back_to_the_coarsest_group_seen():
    train = [ex("rg/a/0/1", "reasoning_gym/a", 1, 0), ex("rg/a/1/1", "reasoning_gym/a", 0, 0),
             ex("rg/b/0/1", "reasoning_gym/b", 1, 0), ex("bfcl/x", "bfcl/x", 0, 0)]  # fmt: skip
    unseen = [ex("rg/c/0/1", "reasoning_gym/c", 0, 0), ex("rg/c/2/1", "reasoning_gym/c", 0, 0),
              ex("bfcl/y", "bfcl/y", 0, 0), ex("trivia/1", "trivia/q", 0, 0)]  # fmt: skip
    assert lookup_keys(unseen[0]) == [
        "rg/c/0",
        "reasoning_gym/difficulty 0",
        "reasoning_gym",
        "all",
    ]
    assert lookup_keys(unseen[2]) == ["bfcl/y", "bfcl", "all"]
    # rg level 0 seen (2 of 2 positive); level 2 only as rg (2 of 3); bfcl (0 of 1); all (2/4)
    assert group_lookup(train, unseen, 0.25) == [1.0, 2 / 3, 0.0, 0.5]


def _family_sets() -> tuple[list[Example], list[Example]]:
    dev, test = [], []
    for fam in ("a/x", "b/y", "c/z"):
        for i in range(12):
            hard = i % 3 == 0
            e = ex(f"{fam}/{i}", fam, 1.0 if hard else 0.5, 0.0 if hard else 0.5,
                   f"{'prove the theorem' if hard else 'say hi'} {fam} {i}")  # fmt: skip
            (test if i >= 9 else dev).append(e)
    return dev, test


def test_a_held_out_family_and_the_test_tasks_are_never_trained_on():
    dev, test = _family_sets()
    seen: list[list[str]] = []

    def train(examples: Sequence[Example]) -> Classifier:
        seen.append([e.id for e in examples])
        return Classifier(fit(examples, l2_grid=(0.01,), folds=2))

    held = leave_one_family_out(dev, test, train, 0.25)
    assert [h.name for h in held] == ["a/x", "b/y", "c/z"]
    test_ids = {e.id for e in test}
    for h, ids in zip(held, seen, strict=True):
        assert not set(ids) & test_ids
        assert not any(i.startswith(h.name) for i in ids)
        assert {e.group for e in h.examples} == {h.name}


def test_figures_macro_pooled_and_intervals():
    a = [ex("a/1", "a", 1, 0), ex("a/2", "a", 0, 0), ex("a/3", "a", 1, 1)]
    b = [ex("b/1", "b", 1, 0), ex("b/2", "b", 0, 0)]
    held = [
        Held("a", a, {"classifier": [0.9, 0.1, 0.2], "always_full": [0.5] * 3}),
        Held("b", b, {"classifier": [0.3, 0.4], "always_full": [0.5] * 2}),  # ranks b backwards
    ]
    good = figures(held, "classifier", 0.25)
    assert good["auc"] == pytest.approx((1.0 + 0.0) / 2)
    # per-family APGR weighted by the full tier's advantage there (1/3 and 1/2)
    assert good["apgr"] == pytest.approx((1 / 3 * 5 / 6 + 1 / 2 * 1 / 4) / (1 / 3 + 1 / 2))
    flat = {"auc": 0.5, "apgr": 0.5, "auc_pooled": 0.5, "apgr_pooled": 0.5}
    assert figures(held, "always_full", 0.25) == flat
    result = evaluate(held, 0.25, boot=40)
    assert result.routers["always_full"]["apgr_ci"] == [0.5, 0.5]
    lo, hi = result.routers["classifier"]["auc_pooled_ci"]
    assert lo <= result.routers["classifier"]["auc_pooled"] <= hi
    best = result.best_baseline["apgr"]
    assert best["name"] == "always_full" and best["value"] == 0.5
    assert best["classifier_minus_best"] == pytest.approx(good["apgr"] - 0.5, abs=1e-4)
    assert result.per_set["b"]["classifier"] == {"auc": 0.0, "apgr": 0.25}


def test_every_router_is_scored_on_the_held_out_tasks():
    dev, test = _family_sets()
    model = Classifier(fit(dev, l2_grid=(0.01,), folds=2))
    scores = router_scores(model, dev, test, 0.25)
    assert {"classifier", "group_lookup", "length_threshold", "always_full",
            "default_rules+classifier", "rule_risky_offered+classifier"} <= set(scores)  # fmt: skip
    assert all(len(v) == len(test) for v in scores.values())


def test_base_rates_say_whether_unseen_families_are_ranked_by_need():
    a = [ex("a/1", "a", 1, 0), ex("a/2", "a", 1, 0)]  # needs full: 100%
    b = [ex("b/1", "b", 1, 0), ex("b/2", "b", 0, 0)]  # 50%
    c = [ex("c/1", "c", 0, 0), ex("c/2", "c", 0, 0)]  # 0%
    held = [Held("a", a, {"classifier": [0.1, 0.2]}), Held("b", b, {"classifier": [0.5, 0.5]}),
            Held("c", c, {"classifier": [0.9, 0.7]})]  # fmt: skip
    rates = base_rates(held, 0.25)
    assert rates["families"]["a"] == {"needs_full": 1.0, "mean_score": 0.15, "to_full": 0.0}
    assert rates["families"]["c"]["to_full"] == 1.0
    assert rates["spearman_needs_full_vs_score"] == -1.0  # backwards
