"""The recorder's writer reading a batch record by record, against the whole batch as one
JSON document (#29).

A batch frame used to be one JSON object holding every record; the writer parsed it with
one ``orjson.loads``. For a frame of agent-sized steps (4 MB, the default bound) orjson
takes a working buffer larger than glibc keeps for reuse, so the kernel maps it in again
every batch: over a thousand page faults a frame. Now each record stands
behind its own length in the frame (``writer_process.batch_body``) and is parsed on its own.

Here both formats carry the same records (``bench.writer_first_steps``' mixes of first
steps: ``identical``, ``opening``, ``none``; 512 steps in frames cut as the recorder cuts
them, at 4 MB by default: ~40 agent steps) into a new SQLite
database each time, in alternating order, in this process: the writer's CPU-µs a step
(user + system, parse to commit, as the writer process runs it: the collector off during a
batch, a young collection after it) and its page faults a step.

    python -m bench.writer_frames [--quick] [--rounds N]

Last line: one JSON object, per mix the medians and the median ratio record-by-record /
whole (``ratio_<mix>``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.writer_first_steps import MIXES, first_steps, frame_records, writer_cost
from gateway.config import StoreSettings
from gateway.recording.records import StepRecord
from gateway.recording.writer_process import (
    Record,
    encode_batch,
    encode_step,
    to_record,
)

FORMATS = ("whole", "by_record")


def batches(encoded: list[bytes]) -> list[list[bytes]]:
    """Cut as the recorder cuts a batch: at ``store.batch_size`` steps or ``store.batch_mb``
    (the defaults: 256, 4 MB: ~40 agent steps)."""
    store = StoreSettings()
    out: list[list[bytes]] = [[]]
    size = 0
    for rec in encoded:
        full = len(out[-1]) >= store.batch_size or size + len(rec) > store.batch_mb * 1_000_000
        if out[-1] and full:
            out.append([])
            size = 0
        out[-1].append(rec)
        size += len(rec)
    return out


def framed(records: list[StepRecord], kind: str) -> list[bytes]:
    chunks = batches([encode_step(r).data for r in records])
    if kind == "by_record":
        return [encode_batch(i, False, chunk) for i, chunk in enumerate(chunks)]
    return [  # the format before: one JSON object, the records an array in it
        orjson.dumps({"batch": i, "resend": False, "records": [orjson.Fragment(x) for x in chunk]})
        for i, chunk in enumerate(chunks)
    ]


def whole(frame: bytes) -> list[Record]:
    """The records of a frame in the format before, parsed as one document."""
    return [to_record(d) for d in orjson.loads(frame)["records"]]


READERS: dict[str, Callable[[bytes], list[Record]]] = {"whole": whole, "by_record": frame_records}


def run(tmp: Path, quick: bool, rounds: int) -> dict[str, Any]:
    count = 128 if quick else 512
    out: dict[str, Any] = {"steps": count, "rounds": {}}
    for mix in MIXES:
        records = first_steps(mix, count)
        frames = {kind: framed(records, kind) for kind in FORMATS}
        for kind in FORMATS:  # imports, caches, the allocator's first growth
            writer_cost(f"sqlite:///{tmp}/warm-{mix}-{kind}.db", frames[kind], READERS[kind])
        runs = []
        for r in range(rounds):
            row: dict[str, float] = {}
            for kind in FORMATS if r % 2 == 0 else tuple(reversed(FORMATS)):
                url = f"sqlite:///{tmp}/{mix}-{kind}-{r}.db"
                us, faults, _ = writer_cost(url, frames[kind], READERS[kind])
                row[f"{kind}_us"], row[f"{kind}_faults"] = round(us, 1), round(faults, 1)
            row["ratio"] = round(row["by_record_us"] / row["whole_us"], 3)
            runs.append(row)
            print(f"{mix:9s} round {r + 1}: whole {row['whole_us']:5.0f} CPU-us/step "
                  f"({row['whole_faults']:4.1f} faults), by record {row['by_record_us']:5.0f} "
                  f"({row['by_record_faults']:4.1f}), {row['ratio']:.2f}x", flush=True)  # fmt: skip
        out["rounds"][mix] = runs
        out[f"ratio_{mix}"] = statistics.median(x["ratio"] for x in runs)
        for key in ("whole_us", "by_record_us", "whole_faults", "by_record_faults"):
            out[f"{key}_{mix}"] = statistics.median(x[key] for x in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seconds: one round of 128 steps")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per mix (default 6)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-frames-") as d:
        result = run(Path(d), args.quick, 1 if args.quick else args.rounds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
