"""bench.side_by_side's summary: medians per arm, ratios of the first arm to the second,
and how often the first was cheaper (the figures bench.revisions and
bench.writer_priority print)."""

from __future__ import annotations

import pytest

from bench.side_by_side import kinds, summarize


def row(cpu: float, p99: float, rps: float = 100.0) -> dict[str, float]:
    return {"p50_ms": 1.0, "p99_ms": p99, "max_ms": p99, "cpu_ms_per_req": cpu,
            "sustained_rps": rps}  # fmt: skip


def test_summary_takes_medians_and_ratios_of_the_first_arm_to_the_second():
    results = {
        "head": {"chat_c1": [row(1.0, 3.0), row(0.8, 2.0), row(1.2, 4.0)],
                 "agent_c64": [row(2.0, 90, 400), row(1.8, 80, 420), row(2.2, 99, 380)]},
        "base": {"chat_c1": [row(1.1, 5.0), row(0.7, 4.0), row(1.3, 6.0)],
                 "agent_c64": [row(2.5, 90, 300), row(2.4, 80, 320), row(2.6, 99, 310)]},
    }  # fmt: skip
    out = summarize(results, {"chat_c1": 1.0}, "head", "base")
    assert out["head_chat_c1"]["cpu_ms_per_req"] == 1.0
    assert out["head_chat_c1"]["added_p99_ms"] == 2.0  # median p99 3.0 less the mock's 1.0
    assert out["base_chat_c1"]["added_p99_ms"] == 4.0
    assert out["ratio_added_p99_ms_chat_c1"] == 0.5
    assert out["ratio_cpu_chat_c1"] == pytest.approx(1.0 / 1.1, abs=1e-3)
    assert out["head_lower_cpu_chat_c1"] == 2  # round 2: 0.8 against 0.7
    assert "added_p99_ms" not in out["head_agent_c64"]  # no mock baseline at c=64
    assert out["ratio_sustained_rps_agent_c64"] == pytest.approx(400 / 310, abs=1e-3)
    assert out["head_lower_cpu_agent_c64"] == 3
    assert out["upstream_p99_ms"] == {"chat_c1": 1.0}


def test_quick_cells_are_small_and_a_request_count_applies_to_the_c1_cells():
    assert kinds(True, None) == {
        "chat_c1": (1, 100, False), "agent_c1": (1, 100, True), "agent_c64": (64, 200, True),
    }  # fmt: skip
    full = kinds(False, 250)
    assert full["chat_c1"][1] == full["agent_c1"][1] == 250 and full["agent_c64"][1] == 2000
