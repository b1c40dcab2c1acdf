"""``bench.tier_plots`` reads a ``bench.tiers`` run's last line and draws each arm that has
both a speed and a quality figure."""

from __future__ import annotations

import json

from bench.tier_plots import main


def arm(c1: float, c4: float, retention: float | None, ci: list[float]) -> dict:
    return {
        "speed": {"tasks": {"answer_speedup_c1": c1, "rps_speedup_c4": c4}},
        "quality": {"greedy": {"quality_retention": retention, "ci": ci, "tasks": 52}},
    }


def test_draws_the_arms_with_speed_and_quality(tmp_path, capsys):
    result = {
        "quality_side": "test",
        "arms": {
            "full": {"speed": {"tasks": {"answer_speedup_c1": 1.0, "rps_speedup_c4": 1.0}}},
            "pruned-ngram": arm(0.95, 0.63, 0.61, [0.52, 0.70]),
            "full-suffix": arm(1.31, 1.07, 1.0, [1.0, 1.0]),
            "speed-only": {"speed": {"tasks": {"answer_speedup_c1": 2.0}}},
        },
    }
    run = tmp_path / "tiers.out"
    run.write_text("progress line\n" + json.dumps(result) + "\n")
    out = tmp_path / "frontier.png"
    drawn = main([str(run), str(out)])
    assert [p["arm"] for p in drawn] == ["pruned-ngram", "full-suffix"]
    assert drawn[0]["retention"] == 0.61 and drawn[1]["answer_speedup_c1"] == 1.31
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["points"] == drawn


def test_a_run_stopped_after_its_speed_cells_takes_quality_from_elsewhere(tmp_path):
    speed = {"c1": {"s_per_answer": 7.0}, "answer_speedup_c1": 1.1, "rps_speedup_c4": 1.2}
    full = {"c1": {"s_per_answer": 7.7}, "answer_speedup_c1": 1.0, "rps_speedup_c4": 1.0}
    run = tmp_path / "tiers.out"
    run.write_text(
        "levers serving: full, full-suffix, pruned-ngram\n"
        + json.dumps(
            {"workload": "tasks", "full": full, "full-suffix": speed, "pruned-ngram": speed}
        )
        + "\n  quality greedy full: 52 tasks in 300 s\n"
    )
    drawn = main(
        [str(run), str(tmp_path / "f.png"), "--quality", "full-suffix=1.0@lossless",
         "--quality", "pruned-ngram=0.607:0.522:0.703@stored outcomes"]
    )  # fmt: skip
    assert {p["arm"]: (p["retention"], p["ci"]) for p in drawn} == {
        "full-suffix": (1.0, [None, None]),
        "pruned-ngram": (0.607, [0.522, 0.703]),
    }
    assert drawn[1]["quality_from"] == "stored outcomes"
