"""bench.router_eval --check: another fast tier's scores set beside the shipped one's."""

from bench.router_eval import tier_sums
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
