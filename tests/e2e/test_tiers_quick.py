"""``python -m bench.tiers --quick`` against the running default stack (the session's
``real_stack``, no engine of its own): a few prompts through the gateway to both tiers, time
per answer and requests/s at concurrency 1 and 4, quality paired on a handful of locked
test-split tasks, and the last line's JSON. A smoke run: no speed or quality threshold."""

from __future__ import annotations

import json

from bench.tiers import main


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
    # the agentic workload: three stored tool-loop steps replayed on both tiers
    for key in ("agentic_step_speedup_c1", "agentic_rps_speedup_c4"):
        assert result[key] > 0, key
    agreement, low = (
        result["agentic_toolcall_agreement"],
        result["agentic_toolcall_agreement_ci_low"],
    )
    assert agreement is not None and 0 <= agreement <= 1  # the three steps include forced calls
    assert low is None or low <= agreement  # one session: no interval to draw
