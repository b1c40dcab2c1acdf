"""bench.kv_reader's questions and statistics (its run needs the reader model and vLLM)."""

from __future__ import annotations

from typing import Any

from bench.kv_reader import bootstrap_ratio, questions, summarize, wilson


def test_each_history_asks_every_fact_and_spreads_them_over_thirds() -> None:
    qs = questions(docs=2, facts=6, lines=60)
    assert len(qs) == 12 and [q.doc for q in qs] == [0] * 6 + [1] * 6
    assert [q.where for q in qs[:6]] == ["early", "early", "middle", "middle", "late", "late"]
    for q in qs:
        body, ask = q.prompt.rsplit("\n\nVault ", 1)
        vault = ask.split(".", 1)[0]  # named first: questions differ from their first token
        assert f"access code of vault {vault}?" in ask
        assert f"NOTE: the access code of vault {vault} is {q.expected}." in body
        at = body.index(f"vault {vault} is") / len(body)
        assert {"early": at < 1 / 3, "middle": 1 / 3 <= at < 2 / 3, "late": at >= 2 / 3}[q.where]
    # one history per document, shared by its questions (the prefix cache's case off)
    assert len({q.prompt.rsplit("\n\nVault ", 1)[0] for q in qs}) == 2
    assert questions(docs=2, facts=6, lines=60) == qs  # deterministic


def test_wilson_and_bootstrap_intervals() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(9, 10)
    assert 0.59 < low < 0.6 and 0.98 < high < 0.99  # the textbook 0.596-0.982
    assert bootstrap_ratio([True] * 20, [True] * 20) == (1.0, 1.0)
    low, high = bootstrap_ratio([True] * 20, [True] * 10 + [False] * 10) or (0.0, 0.0)
    assert low < 0.5 < high and high <= 1.0
    assert bootstrap_ratio([False] * 5, [True] * 5) is None


def rows(correct: list[bool], tokens: list[int], key: str = "prompt_tokens") -> dict[str, Any]:
    wheres = ["early", "middle", "late"] * (len(correct) // 3)
    return {
        "rows": [{"prompt_tokens": 1000, key: t, "correct": c, "where": w, "seconds": 2.0}
                 for c, t, w in zip(correct, tokens, wheres, strict=True)],
        "block_size": 128,
    }  # fmt: skip


def test_summary_counts_right_answers_per_position_and_blocks_held() -> None:
    off = rows([True, True, True, True, False, True], [1000] * 6)
    on = rows([True, False, True, True, False, False], [500] * 6, key="kept_tokens")
    s = summarize(off, on)
    assert s["accuracy_vs_full_cache"] == 0.6  # 3 of 5
    assert s["by_position"]["middle"] == {
        "n": 2, "off": 1, "on": 0, "off_ci": wilson(1, 2), "on_ci": wilson(0, 2),
    }  # fmt: skip
    assert s["kv_blocks_held_off"] == 6 * 8 and s["kv_blocks_held_on"] == 6 * 4
    assert s["concurrency_ratio"] == 2.0 and s["agreement"] == round(4 / 6, 3)
