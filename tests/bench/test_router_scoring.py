"""Exact-answer scoring: normalised numbers and words, never substring containment."""

import pytest

from bench.router_scoring import exact_answer, exact_answer_score, tokens


@pytest.mark.parametrize(
    ("expected", "answer", "score"),
    [
        ("0", "100", 0.0),  # substring containment counted this as right
        ("0", "It freezes at 100 degrees.", 0.0),
        ("100", "0", 0.0),
        ("0", "0", 1.0),
        ("0", "The freezing point of water is 0 degrees Celsius.", 1.0),
        ("4", "2 + 2 = 4", 1.0),
        ("4", "The answer is 4.0", 1.0),
        ("4", "14", 0.0),
        ("1000", "1,000", 1.0),
        ("seven", "There are 7 days in a week.", 1.0),
        ("seven", "seventeen", 0.0),
        ("21", "twenty-one", 1.0),
        ("Paris", "The capital of France is Paris.", 1.0),
        ("Paris", "Paris.\nIt has been the capital since 508.", 1.0),
        ("Paris", "Paris is the capital of France.", 0.0),  # no guessing where it hides
        ("Paris", "Comparison", 0.0),
        ("carbon dioxide", "Plants absorb carbon dioxide.", 1.0),
        ("lion", "The lion.", 1.0),
        ("Egypt", "Egyptian", 0.0),
        ("Cairo", "Caïro", 1.0),
    ],
)
def test_exact_answers(expected: str, answer: str, score: float):
    assert exact_answer_score(expected, answer) == score


def test_normalisation():
    assert tokens("The  1,000.50 APPLES, an orange; twenty one!") == ["1000.5", "apples", "orange", "21"]  # fmt: skip
    assert tokens("-0.0") == ["0"]


def test_checker_reads_the_message_and_refuses_an_empty_expectation():
    check = exact_answer("Tokyo")
    assert check({"content": "Tokyo"}) == 1.0
    assert check({"content": None}) == 0.0 and check({}) == 0.0
    with pytest.raises(ValueError, match="no words or numbers"):
        exact_answer("?!")


def test_trivia_tasks_use_the_exact_scorer():
    from bench.router_tasks import trivia_tasks

    freezing = next(t for t in trivia_tasks() if "freezing point" in t.body["messages"][0]["content"])  # fmt: skip
    assert freezing.check is not None
    assert freezing.check({"content": "100"}) == 0.0
    assert freezing.check({"content": "0 degrees Celsius"}) == 1.0
