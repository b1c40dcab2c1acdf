"""What SQLite's ``synchronous=FULL`` costs the recorder's writer, beside ``NORMAL`` (#29).

The store runs SQLite in WAL mode with ``synchronous=FULL`` (``gateway.store.database``):
a batch is on disk before the writer acknowledges it. ``NORMAL`` would skip the fsync at
each commit and lose the last batches on a power cut. It was listed as a lever on the
request path's CPU (docs/decisions/request-path-cpu-floor.md); this measures whether it is
one: the writer (``bench.writer_first_steps.writer_cost``) on the same frames of
agent-sized first steps (``bench.writer_first_steps``' ``identical`` mix, as
``bench.gateway_overhead``'s agent-body cells send), FULL and NORMAL taking turns, each
into a new database in a temporary directory on the disk the store would use.

Figures per step, each round and their medians: the writer process's CPU-µs (user +
system) and its wall-clock µs (what the fsync adds to a batch's latency, not to its CPU).

    python -m bench.writer_sync [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from bench.writer_first_steps import first_steps, frames, writer_cost
from gateway.store.database import make_engine

MODES = ("FULL", "NORMAL")


def engine_at(synchronous: str) -> Callable[[str], Engine]:
    """``make_engine`` with ``synchronous`` set after the store's own pragmas."""

    def make(url: str) -> Engine:
        engine = make_engine(url)

        def pragma(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(f"PRAGMA synchronous={synchronous}")

        event.listen(engine, "connect", pragma)  # after the store's listener: it wins
        return engine

    return make


def synchronous_of(url: str, synchronous: str) -> str:
    """The pragma as a connection made by ``engine_at(synchronous)`` reports it."""
    engine = engine_at(synchronous)(url)
    try:
        with engine.connect() as conn:
            level = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    finally:
        engine.dispose()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[int(level or 0)]


def run(tmp: Path, quick: bool, rounds: int) -> dict[str, Any]:
    count = 64 if quick else 512
    framed = frames(first_steps("identical", count))
    for mode in MODES:  # what each engine really runs with
        got = synchronous_of(f"sqlite:///{tmp}/check-{mode}.db", mode)
        if got != mode:
            raise RuntimeError(f"asked for synchronous={mode}, the connection has {got}")
    writer_cost(f"sqlite:///{tmp}/warm.db", framed[:1])  # imports, caches
    out: dict[str, Any] = {"steps": count, "rounds": []}
    for r in range(rounds):
        row: dict[str, float] = {}
        for mode in MODES:
            url = f"sqlite:///{tmp}/{mode}-{r}.db"
            cost = writer_cost(url, framed, engine_of=engine_at(mode))
            row[f"cpu_us_{mode.lower()}"] = round(cost.cpu_us, 1)
            row[f"wall_us_{mode.lower()}"] = round(cost.wall_us, 1)
        row["cpu_ratio_normal_vs_full"] = round(row["cpu_us_normal"] / row["cpu_us_full"], 3)
        out["rounds"].append(row)
        print(f"round {r + 1}: CPU-us/step FULL {row['cpu_us_full']:5.0f} NORMAL "
              f"{row['cpu_us_normal']:5.0f} ({row['cpu_ratio_normal_vs_full']:.2f}x); wall-us/step "
              f"FULL {row['wall_us_full']:5.0f} NORMAL {row['wall_us_normal']:5.0f}", flush=True)  # fmt: skip
    for key in out["rounds"][0]:
        out[key] = statistics.median(r[key] for r in out["rounds"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seconds: one round of 64 steps")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-sync-") as d:
        result = run(Path(d), args.quick, 1 if args.quick else args.rounds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
