"""Replaying the dead-letter file: steps the database refused, written again once it accepts.

The writer process appends a step it cannot commit (after retrying a lost connection, and
one by one after a failed batch) to ``store.dead_letter_path`` as one JSON line. After the
cause is fixed (a full disk, a constraint a migration relaxed, a bug in a reward hook),
``gearshift db replay`` writes them with the same code as the recorder: steps already in
the store are skipped (so a replay can be repeated), steps that fail again go back to the
dead-letter file, and nothing is lost if the replay itself is interrupted.

The file is first renamed aside, so a gateway that keeps running appends new dead letters
to a fresh file instead of racing the replay.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from gateway.recording.writer import StepWriter
from gateway.recording.writer_process import BatchWriter, to_record
from gateway.store.database import make_engine
from gateway.store.rewards import load_hooks


@dataclass(frozen=True, slots=True)
class ReplayResult:
    written: int = 0
    already: int = 0  # in the store already (an earlier replay, or a resent batch)
    failed: int = 0  # refused again, back in the dead-letter file
    unreadable: int = 0  # not a step record; kept in the dead-letter file as they were


def replay(url: str, path: Path, hooks: list[str] | None = None) -> ReplayResult:
    if not path.exists():
        return ReplayResult()
    aside = path.with_name(f"{path.name}.replaying-{int(time.time())}")
    os.replace(path, aside)
    engine = make_engine(url)
    batches = BatchWriter(engine, path, StepWriter(load_hooks(hooks or [])))
    written = already = failed = unreadable = 0
    try:
        with aside.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    record = to_record(orjson.loads(line))
                except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
                    unreadable += 1
                    with path.open("ab") as out:  # keep it for a person to look at
                        out.write(line if line.endswith(b"\n") else line + b"\n")
                    continue
                new, dead = batches.write([record], resend=True)
                written += new
                failed += dead
                already += 1 - new - dead
    except BaseException:
        # interrupted: put back what was not replayed (replaying it again is harmless)
        with path.open("ab") as out, aside.open("rb") as f:
            out.write(f.read())
        aside.unlink()
        raise
    finally:
        engine.dispose()
    aside.unlink()
    return ReplayResult(written, already, failed, unreadable)
