"""The recorder's hand-off on the request path: a step's frame entry built as parts (#29).

The gateway encodes each step it records into its entry of a writer frame when the step is
offered, and the queue holds the entries until the consumer writes a batch to the writer
process. An agent step's entry is ~100 KB, almost all of it two raw values: the client's
request bytes and the prompt's ids. Here the two ways of building entries take turns on
the same records, each keeping a queue's worth alive (64 entries, as a batch holds them
before it is written) and then building the batch's frame:

- ``whole``: orjson writes the record with the raw values copied into its output (its
  buffer grown as it goes), and the batch's frame is joined into one bytes object, as the
  recorder did before;
- ``parts``: ``writer_process.encode_step`` (orjson writes the record around the raw
  values, which are spliced in uncopied) and ``batch_parts`` (the frame as a list of
  parts, written with ``writelines``), as the recorder does now.

Records: ``bench.writer_first_steps``' agent-body first steps (39 KB request, ~9,850 prompt
ids as the request path cuts them). Figures per step: CPU-µs (user + system) and minor page
faults of this process, each round and their medians, and the median ratio parts / whole.
The byte-for-byte equality of the two frames is checked on every batch.

    python -m bench.record_encoding [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
from collections.abc import Callable
from typing import Any

import orjson

from bench.writer_first_steps import first_steps
from gateway.recording.cut import PromptIds, as_written
from gateway.recording.records import StepRecord
from gateway.recording.writer_process import batch_parts, encode_batch, encode_step

WINDOW = 64  # entries a batch holds before it is written


def _whole_value(value: object) -> orjson.Fragment:
    if isinstance(value, PromptIds):
        return orjson.Fragment(value.quoted)
    return as_written(value)


def whole(records: list[StepRecord], batch: int) -> bytes:
    """As the recorder did: each entry one bytes object, the frame joined."""
    return encode_batch(batch, False, [orjson.dumps(r, default=_whole_value) for r in records])


def parts(records: list[StepRecord], batch: int) -> list[bytes]:
    """As the recorder does: entries as parts, the frame a list of parts."""
    return batch_parts(batch, False, [encode_step(r) for r in records])


KINDS: dict[str, Callable[[list[StepRecord], int], Any]] = {"whole": whole, "parts": parts}


def cost(kind: str, records: list[StepRecord]) -> tuple[float, float]:
    """CPU-µs and minor page faults a step, building ``records``' frames window by window."""
    build = KINDS[kind]
    gc.collect()
    gc.disable()
    before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        for at in range(0, len(records), WINDOW):
            frame = build(records[at : at + WINDOW], at)
            del frame  # written and acknowledged: the batch's entries go
    finally:
        after = resource.getrusage(resource.RUSAGE_SELF)
        gc.enable()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu * 1e6 / len(records), (after.ru_minflt - before.ru_minflt) / len(records)


def run(quick: bool, rounds: int) -> dict[str, Any]:
    records = first_steps("identical", 128 if quick else 1024)
    for at in range(0, len(records), WINDOW):  # the same frame, byte for byte
        if b"".join(parts(records[at : at + WINDOW], at)) != whole(records[at : at + WINDOW], at):
            raise RuntimeError(f"the two encodings differ in the batch at record {at}")
    for kind in KINDS:  # warm: imports, the allocator's first growth
        cost(kind, records[:WINDOW])
    out: dict[str, Any] = {"steps": len(records), "rounds": []}
    for r in range(rounds):
        row: dict[str, float] = {}
        for kind in KINDS:
            us, faults = cost(kind, records)
            row[f"{kind}_us"], row[f"{kind}_faults"] = round(us, 2), round(faults, 1)
        row["ratio"] = round(row["parts_us"] / row["whole_us"], 3)
        out["rounds"].append(row)
        print(f"round {r + 1}: whole {row['whole_us']:6.1f} CPU-us/step ({row['whole_faults']:5.1f} "
              f"faults), parts {row['parts_us']:6.1f} ({row['parts_faults']:5.1f} faults): "
              f"{row['ratio']:.2f}x", flush=True)  # fmt: skip
    for key in out["rounds"][0]:
        out[key] = statistics.median(r[key] for r in out["rounds"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seconds: one round of 128 steps")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(json.dumps(run(args.quick, 1 if args.quick else args.rounds)))


if __name__ == "__main__":
    main()
