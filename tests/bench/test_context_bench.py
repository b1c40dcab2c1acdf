"""``python -m bench.context --quick`` on the mock upstream: every strategy answers every
step, the condensing ones send fewer tokens than ``none``, and the mock's oracle reader
finds the early fact where the strategy kept it (``none`` always; the extractive summary
and the masked output's digest keep named values; a bare placeholder does not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bench.test_quick import ROOT, run_quick


def test_quick_context_bench_measures_every_strategy() -> None:
    last = run_quick("context", timeout_s=300)
    rows = last["strategies"]
    assert isinstance(rows, dict) and set(rows) >= {"none", "mask", "extractive", "default"}
    assert "default-before" in rows
    assert all(r["errors"] == 0 for r in rows.values()), rows
    assert rows["none"]["accuracy"] == 1.0  # the whole history: the fact is there
    assert rows["none"]["exact"] == 1.0 and rows["none"]["accuracy_ci95"] == [1.0, 1.0]
    assert rows["default-before"]["accuracy_ci95"] == [0.0, 0.0]
    assert all(r["ms_per_answer"] > 0 for r in rows.values()), rows
    # the mock has no prefix cache: no hit rate, and no reset was asked
    assert last["prefix_cache_hit_rate"] is None and last["prefix_cache_reset"] is False
    assert last["sessions"] == 4  # every arm ran every session
    assert rows["extractive"]["accuracy"] == 1.0 and rows["extractive"]["summaries"] > 0
    assert rows["mask"]["accuracy"] == 1.0  # the placeholder's digest keeps the named value
    assert rows["default-before"]["accuracy"] == 0.0  # a bare placeholder does not
    # clearing to half the budget: fewer tokens than clearing to just under it
    assert rows["default"]["tokens_vs_none"] < rows["default-before"]["tokens_vs_none"]
    for name, row in rows.items():
        if name != "none":
            assert row["tokens_vs_none"] < 0.7, (name, row)
    assert 0.3 < last["prompt_tokens_saved"] < 1
    # the prefix a clearing keeps: the next steps' prompts extend the condensed one
    assert rows["none"]["extends_previous"] == 1.0 and rows["none"]["summaries_per_session"] == 0
    assert rows["default"]["extends_previous"] > rows["default-before"]["extends_previous"]
    assert last["extends_previous"] == rows["default"]["extends_previous"]
    assert rows["extractive"]["summaries_per_session"] == rows["extractive"]["summaries"] / 4


def test_the_stored_sessions_replay_with_intervals_per_family_and_a_plot(tmp_path: Path) -> None:
    """A handful of the stored sessions (bench/data, the default when the file is there):
    with the whole history the mock's reader answers every early question and the end
    task; a condensing strategy sends fewer tokens; the plot is written."""
    plot = tmp_path / "context.png"
    argv = [sys.executable, "-m", "bench.context", "--sessions", "4", "--replay", "1",
            "--strategies", "none,mask,default", "--plot", str(plot)]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["data"] == "bench/data/context_sessions.jsonl.gz" and last["sessions"] == 4
    rows = last["strategies"]
    none = rows["none"]
    assert none["accuracy"] == 1.0 and none["end_task"] == 1.0 and none["errors"] == 0
    assert set(none["by_family"]) == {"build", "data", "migration", "service"}
    assert none["exact"] == 1.0  # 3 early questions per session: code, file, number
    for name in ("mask", "default"):
        assert rows[name]["tokens_vs_none"] < 0.8 and rows[name]["errors"] == 0, rows[name]
        assert rows[name]["end_task"] == 1.0  # the latest output is never condensed
        lo, hi = rows[name]["accuracy_ci95"]
        assert lo <= rows[name]["accuracy"] <= hi
    assert plot.stat().st_size > 10_000
