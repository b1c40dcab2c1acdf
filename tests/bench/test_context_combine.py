"""bench.context's per-session records (``--records``, ``--skip``) and bench.context_combine:
a run recorded per (session, strategy) reads back as the run's own table, a run cut
mid-session counts only the sessions every strategy finished, and ``given_none_right``
scores a strategy on the questions ``none`` answered."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from bench.context import sessions_for
from bench.context_combine import combine, read_records
from bench.context_measure import Score, Tally
from tests.bench.test_quick import ROOT


def session_tally(tokens: list[int], right: list[bool], family: str = "build") -> Tally:
    t = Tally(prompt_tokens=tokens, ms=[1.0] * len(tokens), sessions=1, summaries=1)
    t.answered(family, [Score(exact=r, normalised=r) for r in right], [])
    return t


def test_merge_of_session_tallies_is_the_whole_run_and_records_round_trip() -> None:
    whole, parts = Tally(), [session_tally([10, 20], [True, False]),
                             session_tally([30], [True], "data")]  # fmt: skip
    for p in parts:  # the whole run tallied as bench.context does: one session at a time
        whole.prompt_tokens += p.prompt_tokens
        whole.ms += p.ms
        whole.sessions += 1
        whole.summaries += 1
        whole.outcomes += p.outcomes
        whole.questions += p.questions
        whole.exact += p.exact
        for f, v in p.by_family.items():
            whole.by_family.setdefault(f, []).extend(v)
    merged = Tally()
    for p in parts:
        merged.merge(Tally.from_record(json.loads(json.dumps(asdict(p)))))
    assert merged == whole
    assert merged.row(None) == whole.row(None)
    assert Tally.from_record({**asdict(parts[0]), "unknown": 1}) == parts[0]


def record(session: int, strategy: str, right: list[bool], tokens: int) -> dict[str, object]:
    answers = [{"key": f"k{j}", "kind": "number", "value": "1", "end": False, "answer": "1",
                "exact": r, "normalised": r} for j, r in enumerate(right)]  # fmt: skip
    tally = session_tally([tokens], right)
    return {"budget": 4096, "session": session, "family": "build", "strategy": strategy,
            "seconds": 2.0, "answers": answers, "tally": asdict(tally)}  # fmt: skip


def test_combine_counts_sessions_every_strategy_finished_and_the_later_record() -> None:
    records = [
        record(0, "none", [True, True, False], 100),
        record(0, "default", [True, False, True], 40),
        record(1, "default", [False, False, False], 40),  # replaced below
        record(1, "none", [True, False, False], 100),
        record(1, "default", [True, False, False], 50),
        record(2, "none", [True, True, True], 100),  # cut before its default arm
    ]
    entry = combine(records)["4096"]
    assert entry["sessions"] == 2 and entry["session_indices"] == [0, 1]
    rows = entry["strategies"]
    assert list(rows) == ["none", "default"]
    assert rows["none"]["accuracy"] == round((2 / 3 + 1 / 3) / 2, 3)
    assert rows["default"]["accuracy"] == round((2 / 3 + 1 / 3) / 2, 3)
    assert rows["default"]["prompt_tokens_total"] == 90
    assert rows["default"]["tokens_vs_none"] == 0.45
    assert rows["default"]["seconds_per_session"] == 2.0
    # none right on 3 questions (0/k0, 0/k1, 1/k0); default right on 0/k0 and 1/k0
    assert rows["default"]["given_none_right"] == {
        "questions": 6, "none_right": 3, "also_right": 2, "share": 0.667}  # fmt: skip


def test_records_from_before_the_fit_split_combine_and_none_s_errors_say_what_fits() -> None:
    """Lines written before ``context_errors`` existed (a run under way keeps writing
    them): they combine as before, and a session where ``none`` had an error counts as
    not fitting; a newer line's ``context_errors`` decides on its own."""
    old = [record(0, "none", [True, True], 100), record(0, "default", [True, False], 40),
           record(1, "none", [False, False], 100), record(1, "default", [True, True], 40)]  # fmt: skip
    for r in old:
        del r["tally"]["context_errors"]  # type: ignore[attr-defined]
    old[2]["tally"]["errors"] = 3  # type: ignore[index]
    entry = combine(old)["4096"]
    assert entry["sessions"] == 2 and entry["strategies"]["none"]["accuracy"] == 0.5
    assert entry["sessions_fitting"] == 1 and entry["sessions_not_fitting"] == 1
    assert entry["accuracy_vs_none"] == 0.5 and entry["accuracy_vs_none_ci95"] == (0.5, 0.5)
    assert entry["accuracy_not_fitting"] == {"none": 0.0, "default": 1.0}
    assert entry["strategies"]["default"]["given_none_right"]["share"] == 0.5
    new = json.loads(json.dumps(old))
    new[2]["tally"]["context_errors"] = 0  # an error, not the window's: the session fits
    assert combine(new)["4096"]["sessions_not_fitting"] == 0
    assert combine(new)["4096"]["accuracy_vs_none"] == round(0.75 / 0.5, 3)


def test_read_records_skips_other_lines(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("budget 4096 tokens\n" + json.dumps(record(0, "none", [True], 9)) + "\n"
                   + '{"upstream": "mock"}\nnot json\n')  # fmt: skip
    assert [r["session"] for r in read_records([log])] == [0]


def test_skip_starts_at_the_datas_nth_session() -> None:
    def args(skip: int, sessions: int) -> argparse.Namespace:
        return argparse.Namespace(seeded=True, skip=skip, sessions=sessions, seed=7, steps=4,
                                  fill=0.5, replay=1, facts="value")  # fmt: skip

    whole = sessions_for(args(0, 5), 4096)
    assert [s.questions for s in sessions_for(args(2, 3), 4096)] == [
        s.questions for s in whole[2:5]
    ]


def test_a_recorded_run_combines_into_its_own_table(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    argv = [sys.executable, "-m", "bench.context", "--sessions", "2", "--skip", "1",
            "--replay", "1", "--strategies", "none,default", "--records", str(records)]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["skip"] == 1 and run["sessions"] == 2
    argv = [sys.executable, "-m", "bench.context_combine", str(records)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    combined = json.loads(proc.stdout.strip().splitlines()[-1])
    assert combined["session_indices"] == [1, 2]
    for name in ("none", "default"):
        mine, theirs = combined["strategies"][name], run["strategies"][name]
        for key in ("prompt_tokens_total", "accuracy", "accuracy_ci95", "exact", "end_task",
                    "summaries", "extends_previous", "ms_per_step", "tokens_vs_none"):  # fmt: skip
            assert mine[key] == theirs[key], (name, key)
    assert combined["accuracy_vs_none"] == run["accuracy_vs_none"]
    assert combined["accuracy_vs_none_ci95"] == run["accuracy_vs_none_ci95"]
    assert combined["sessions_fitting"] == run["sessions_fitting"] == 2
    assert combined["strategies"]["none"]["given_none_right"]["share"] == 1.0
