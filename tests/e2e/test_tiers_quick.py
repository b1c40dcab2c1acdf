"""``python -m bench.tiers --quick`` against the running default stack (the session's
``real_stack``, no engine of its own): a few prompts through the gateway to both tiers, time
per answer and requests/s at concurrency 1 and 4, quality paired on a handful of locked
test-split tasks, two stored agentic steps with tool-call agreement, and the last line's
JSON. A smoke run: no speed or quality threshold."""

from __future__ import annotations

import json

import pytest

from bench.tiers import main

pytestmark = pytest.mark.e2e  # runs at the end, with the session's stack


def test_quick_run_reports_per_answer_speed_and_paired_quality(real_stack, capsys):
    result = main(["--url", real_stack.url, "--quick"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == result

    assert result["headline"] == "fast" and result["quality_side"] == "test"
    for key in ("answer_speedup_c1", "rps_speedup_c4", "length_ratio_c1"):
        assert result[key] > 0, key
    for arm in ("full", "fast"):
        for workload in ("tasks", "repetitive"):
            for c in ("c1", "c4"):
                speed = result["arms"][arm]["speed"][workload][c]
                assert speed["answers"] == 4 and speed["s_per_answer"] > 0 and speed["rps"] > 0
    greedy = result["arms"]["fast"]["quality"]["greedy"]
    assert greedy["tasks"] == 3 == result["quality_tasks"]
    assert set(greedy["per_source"]) <= {"bfcl", "reasoning_gym", "trivia"}
    assert 0 <= greedy["full"] <= 1 and 0 <= greedy["candidate"] <= 1
    if greedy["quality_retention"] is not None:  # None when the full tier scored nothing
        assert result["quality_retention_ci_low"] <= greedy["quality_retention"]
    # the agentic workload: the first step (a forced tool call) of two stored sessions,
    # replayed on both tiers at concurrency 1 only
    for arm in ("full", "fast"):
        speed = result["arms"][arm]["speed"]["agentic"]
        assert set(speed) >= {"c1"} and "c4" not in speed
        assert speed["c1"]["answers"] == 2 and speed["c1"]["s_per_answer"] > 0
    assert result["agentic_step_speedup_c1"] > 0 and result["agentic_rps_speedup_c4"] is None
    calls = result["arms"]["fast"]["agentic_toolcall"]
    assert calls["tool_steps"] == 2 and calls["free_steps"] == 0
    agreement, low = (
        result["agentic_toolcall_agreement"],
        result["agentic_toolcall_agreement_ci_low"],
    )
    assert agreement in (0.0, 0.5, 1.0)  # two forced calls, each agrees or not
    assert low is not None and low <= agreement  # two sessions: an interval is drawn
