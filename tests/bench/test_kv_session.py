"""bench.kv_session's session and arithmetic (its run on the real stack is
tests/e2e/test_kv_compaction.py::test_kv_session_quick)."""

from __future__ import annotations

from itertools import pairwise

from bench.kv_session import FACTS, compare, session_prompts


def test_the_session_grows_and_asks_where_the_facts_sit() -> None:
    prompts = session_prompts(4, 30)
    assert len(prompts) == 3 + 3  # one question a step, three at the last
    messages = [m for m, _, _ in prompts]
    # each step extends the last one's history
    history = [m.rsplit("\n\nQuestion:", 1)[0] for m in messages]
    assert all(b.startswith(a) for a, b in pairwise(history))
    assert [(v, w) for _, v, w in prompts[-3:]] == [
        (FACTS[0][1], "early"), (FACTS[1][1], "middle"), (FACTS[2][1], "late"),
    ]  # fmt: skip
    last = history[-1]
    notes = [last.index(f"NOTE: the {what} is {value}.") for what, value in FACTS]
    assert notes == sorted(notes) and notes[0] < len(last) / 4 and notes[2] > len(last) * 3 / 4
    assert [w for _, _, w in session_prompts(2, 24, 1)] == ["early", "early"]


def run(kept: list[int], correct: int, seconds: float) -> dict[str, object]:
    return {
        "kept_tokens": kept, "prompt_tokens": [700, 1300], "correct": correct, "steps": 2,
        "seconds_per_step": seconds, "peak_kv_usage": 0.1, "block_size": 128,
        "by_position": {"early": True},
    }  # fmt: skip


def test_compare() -> None:
    result = compare(run([700, 1300], 2, 10.0), run([700, 650], 1, 15.0))
    # blocks held: 6 + 11 off, 6 + 6 on
    assert result["concurrency_ratio"] == 17 / 12
    assert result["accuracy_vs_full_cache"] == 0.5 and result["time_ratio"] == 1.5
    assert compare(run([1], 0, 1.0), run([1], 0, 1.0))["accuracy_vs_full_cache"] is None
