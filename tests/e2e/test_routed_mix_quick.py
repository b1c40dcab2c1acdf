"""``python -m bench.routed_mix --quick`` against the running default stack (the session's
``real_stack``, no engine of its own): three short locked test-split tasks routed by the
default router, pinned to the full tier and pinned to the fast tier, with the CPU time of the
stack's whole process tree charged per arm, and the last line's JSON. A smoke run: no speed
or quality threshold."""

from __future__ import annotations

import json

import pytest

from bench.routed_mix import main

pytestmark = pytest.mark.e2e  # runs at the end, with the session's stack


def test_quick_run_reports_tasks_per_cpu_second_and_paired_quality(real_stack, capsys):
    result = main(["--url", real_stack.url, "--quick"])
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1]) == result
    assert "charging CPU of pid" in captured.err  # progress goes to stderr

    assert result["side"] == "test" and result["tasks"] == 3 and result["concurrency"] == 4
    for name in ("routed", "full", "fast"):
        arm = result["arms"][name]
        assert arm["tasks"] == 3 == arm["completed"], name  # no 5xx, no timeout
        # the gateway, both vLLM servers and the writer did work during the arm's window
        assert arm["cpu_s"] > 0 and arm["tasks_per_cpu_s"] > 0 and arm["tasks_per_s"] > 0
        assert arm["s_per_task_p50"] > 0 and arm["s_per_task_mean"] > 0
        assert 0 <= arm["quality"] <= 1
    assert result["arms"]["full"]["tier_share"] == {"full": 1.0, "fast": 0.0}
    assert result["arms"]["fast"]["tier_share"] == {"full": 0.0, "fast": 1.0}
    share = result["arms"]["routed"]["tier_share"]
    assert share["full"] + share["fast"] == 1.0 and result["fast_share"] == share["fast"]
    assert result["tasks_per_cpu_s_ratio"] > 0 and result["time_per_task_ratio"] > 0
    for key in ("quality_vs_full", "quality_vs_full_ci_low"):  # None: full scored nothing
        assert result[key] is None or result[key] >= 0
    assert result["replay_agreement"] is not None  # the replayed router saw these requests too
