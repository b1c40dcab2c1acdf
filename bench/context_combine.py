"""Combines ``bench.context --records`` logs into one run's table: a long run cut short, or
one run in batches (``--skip kN --sessions N``), read as if it had run whole.

    python -m bench.context_combine RECORDS.jsonl [MORE.jsonl ...]

Each record is one (session, strategy) of one budget: its tally (bench.context_measure's
``Tally``, the session alone) and its questions' answers. Per budget, only the sessions
that every strategy finished count (a run cut mid-session leaves one arm without the
other); a session recorded twice counts once, the later record. The strategies' tallies
are summed in session order and printed as ``bench.context`` prints them (accuracy with
its bootstrap 95% interval over sessions, prompt tokens against ``none``), and each row
gains ``seconds_per_session`` (one session's arm, its summaries included) and
``given_none_right``: of the early questions ``none`` answered right, the share this
strategy answered right too (what condensing cost where the reader could read at all).
As in ``bench.context``, a session fits when ``none``'s record counts no context-length
400 (its tally's ``context_errors``; a record written before that count existed: no
error at all), the headline (``accuracy_vs_none`` and its paired bootstrap interval
``accuracy_vs_none_ci95``, ``prompt_tokens_saved``) is on the sessions that fit, and
``fitting``, ``not_fitting``, ``accuracy_not_fitting`` and the session counts are added.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from bench.context import figures, merged, print_split, print_table
from bench.context_measure import Tally, ratio

Key = tuple[int, str]  # (session index, strategy)


def read_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every record line of ``paths`` in order; other lines (a run's table) are skipped."""
    records = []
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict) and {"strategy", "session", "tally"} <= data.keys():
                records.append(data)
    return records


def combine(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per budget (its tokens, as a string): the sessions every strategy finished, and
    the strategies' rows; ``none`` is the base the ratios are against."""
    by_budget: dict[int, dict[Key, dict[str, Any]]] = {}
    for r in records:  # a later record of the same session and strategy replaces one
        by_budget.setdefault(int(r["budget"]), {})[(int(r["session"]), r["strategy"])] = r
    out: dict[str, Any] = {}
    for budget, found in sorted(by_budget.items()):
        names = sorted({name for _, name in found}, key=lambda n: (n != "none", n))
        sessions = sorted({i for i, _ in found if all((i, n) in found for n in names)})
        per = {n: [Tally.from_record(found[(i, n)]["tally"]) for i in sessions] for n in names}
        if "none" in per:
            fit = [fits(found[(i, "none")]["tally"]) for i in sessions]
            entry = figures(per, fit, names)
        else:  # no base: every strategy's rows, nothing against none
            entry = {"strategies": {n: merged(per[n]).row(None) for n in names}}
        for n, row in entry["strategies"].items():
            row["seconds_per_session"] = _mean_or_none([found[(i, n)]["seconds"] for i in sessions])
            row["given_none_right"] = given_none_right(found, sessions, n)
        out[str(budget)] = {"budget": budget, "sessions": len(sessions),
                            "session_indices": sessions, **entry}  # fmt: skip
    return out


def fits(none: dict[str, Any]) -> bool:
    """Whether a session fits the window, from ``none``'s recorded tally: no context-length
    400 (``context_errors``); a record from before that count: no error at all."""
    return int(none["context_errors"] if "context_errors" in none else none["errors"]) == 0


def given_none_right(found: dict[Key, dict[str, Any]], sessions: list[int], name: str) -> Any:
    """Of the early questions ``none`` answered right (normalised), how many ``name``
    answered right: {"questions", "none_right", "also_right", "share"}."""
    if not all((i, "none") in found for i in sessions):
        return None
    questions = none_right = also = 0
    for i in sessions:
        base = [a for a in found[(i, "none")]["answers"] if not a["end"]]
        mine = {a["key"]: a for a in found[(i, name)]["answers"] if not a["end"]}
        for a in base:
            questions += 1
            if a["normalised"]:
                none_right += 1
                also += bool(mine.get(a["key"], {}).get("normalised"))
    return {"questions": questions, "none_right": none_right, "also_right": also,
            "share": ratio(also, none_right)}  # fmt: skip


def _mean_or_none(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, nargs="+", help="bench.context --records files")
    args = parser.parse_args()
    combined = combine(read_records(args.records))
    if not combined:
        raise SystemExit("context_combine: no records in " + ", ".join(map(str, args.records)))
    for entry in combined.values():
        rows = entry["strategies"]
        print(f"budget {entry['budget']} tokens: {entry['sessions']} sessions "
              f"{entry['session_indices']}")  # fmt: skip
        print_table(rows)
        for n, r in rows.items():
            print(f"{n:<16}s/session {r['seconds_per_session']}  given none right "
                  f"{r['given_none_right']}")  # fmt: skip
        if "none" in rows:
            print_split(entry)
    first = next(iter(combined.values()))
    print(orjson.dumps({**first, "by_budget": combined if len(combined) > 1 else None}).decode())


if __name__ == "__main__":
    main()
