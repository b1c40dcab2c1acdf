"""bench.router_eval --check: another fast tier's scores beside the shipped one's; repeated labels."""

from pathlib import Path

from bench.router_checks import how as _how
from bench.router_checks import repeatability, tier_sums
from router.training import Example


def ex(task_id: str, full: float, fast: float) -> Example:
    return Example(task_id, {"messages": []}, full, fast)


def test_tier_sums_compare_the_same_tasks_per_source():
    base = [ex("bfcl/a", 1, 0), ex("bfcl/b", 1, 1), ex("rg/x/0/1", 1, 1), ex("trivia/q", 1, 0)]
    other = [ex("bfcl/a", 1, 1), ex("bfcl/b", 1, 1), ex("rg/x/0/1", 0.5, 0)]  # trivia not covered
    assert tier_sums(other, base) == {
        "all": {"tasks": 3, "full": 2.5, "fast": 2, "fast_outcomes": 2},
        "bfcl": {"tasks": 2, "full": 2, "fast": 2, "fast_outcomes": 1},
        "rg": {"tasks": 1, "full": 0.5, "fast": 0, "fast_outcomes": 1},
    }


def test_repeatability_scores_the_shipped_labels_against_a_second_collection():
    base = [ex("a", 1, 0), ex("b", 1, 0), ex("c", 0, 0), ex("d", 0, 0), ex("e", 1, 1)]
    # collected again: "b" no longer needs full, "d" now does; "e" not collected
    again = [ex("a", 1, 0), ex("b", 0, 0), ex("c", 0, 0), ex("d", 1, 0)]
    r = repeatability(again, base, margin=0.25)
    assert r["tasks"] == 4
    assert r["label_agreement"] == 0.5
    assert r["positives"] == [2, 2]
    # positives a (known 1), d (0); negatives b (1), c (0): a>c right, d<b wrong, two ties
    assert r["auc_known_labels"] == 0.5


def test_repeatability_without_both_labels_has_no_auc():
    base = [ex("a", 1, 0), ex("b", 0, 0)]
    assert repeatability([ex("a", 0, 0), ex("b", 0, 0)], base, 0.25)["auc_known_labels"] is None


def test_a_repeat_must_be_collected_like_the_regime_it_repeats(tmp_path):
    def outcomes(name: str, first: str) -> Path:
        path = tmp_path / name
        path.write_text(first + '\n{"key": "k", "id": "a", "full": {}, "fast": {}}\n')
        return path

    greedy = outcomes("g.jsonl", '{"samples": 1, "temperature": 0.0}')
    sampled = outcomes("s.jsonl", '{"samples": 4, "temperature": 0.7}')
    older = outcomes("o.jsonl", '{"models": ["auto"]}')  # before headers named samples
    assert _how(greedy) == _how(older) == (1, 0.0)
    assert _how(sampled) == (4, 0.7)
