"""The recorder's writer: its own process, so that writing never competes with requests.

A thread would share the gateway's interpreter lock: while it turned a batch into
rows, every request waiting on the event loop paid for it in latency (measured:
engine-bound throughput fell to 0.88 of no recording, streams to 0.86;
docs/decisions/recorder-process.md). Here the gateway only serializes records.

Wire: frames on stdin/stdout, each a 4-byte big-endian length and a body. The first
frame configures the writer (on stdin, not argv, so that a database password never shows
in the process list); its body and the acknowledgements' are one orjson object each:

    gateway -> writer  {"url": ..., "dead_letter": ..., "cpus": [..] | null, "hooks": [..]}
    gateway -> writer  batch: {"batch": N, "resend": bool, "records": n}, then n records
    writer -> gateway  {"batch": N, "written": n, "dead": m, "seconds": s}

A batch frame's body is parts, each behind its own 4-byte length: the object above, then
each record (a StepRecord or ToolResultRecord as ``encode_step`` wrote it). The writer
parses the records one by one: parsing a whole batch as one document (~40 agent steps,
4 MB) made orjson take a working buffer of several times that, which glibc maps afresh
every time (over 32 MiB): more than a thousand page faults a batch
(docs/decisions/writer-batch-frames.md).

The acknowledgement is sent after the commit, so an acknowledged record is on
disk. A batch resent after a writer crash may already be committed: its records
whose step ids exist are skipped. Records the database refuses are retried one
by one and, if they still fail, appended to the dead-letter file. End of input
ends the process.

    python -m gateway.recording.writer_process
"""

from __future__ import annotations

import gc
import logging
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import DBAPIError, OperationalError

from gateway.recording.cut import PromptIds
from gateway.recording.records import (
    ChainHashes,
    ChoiceCapture,
    RawJson,
    StepRecord,
    ToolResultRecord,
)
from gateway.recording.writer import StepWriter
from gateway.store.database import make_engine
from gateway.store.rewards import load_hooks
from gateway.store.schema import steps

log = logging.getLogger("gearshift.recorder")

HEADER = struct.Struct(">I")
Record = StepRecord | ToolResultRecord
MAX_FRAME = 1 << 30
FULL_COLLECTION_EVERY = 64  # batches; young collections run after every batch


def encode(message: Any) -> bytes:
    body = orjson.dumps(message)
    return HEADER.pack(len(body)) + body


class Entry:
    """A record's entry in a batch frame, as parts to be written one after another: the JSON
    orjson wrote around the record's raw values, and those values (the request's bytes, the
    prompt's ids) spliced in as they are (``encode_step``). ``size``: the entry's length."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple[bytes, ...]) -> None:
        self.parts = parts
        self.size = sum(len(part) for part in parts)

    @property
    def data(self) -> bytes:
        """The entry's bytes, joined (a copy: for tests and benchmarks)."""
        return b"".join(self.parts)


def batch_parts(batch: int, resend: bool, records: Sequence[Entry | bytes]) -> list[bytes]:
    """A whole batch frame (its length first) as the parts to write one after another, from
    records already encoded (``encode_step``): their parts are not copied here, and the
    pipe's writer takes them as they are (``writelines``)."""
    head = b'{"batch":%d,"resend":%s,"records":%d}' % (
        batch, b"true" if resend else b"false", len(records)
    )  # fmt: skip
    parts = [b"", HEADER.pack(len(head)), head]
    size = HEADER.size + len(head)
    for rec in records:
        if isinstance(rec, Entry):
            parts.append(HEADER.pack(rec.size))
            parts += rec.parts
            size += HEADER.size + rec.size
        else:
            parts += (HEADER.pack(len(rec)), rec)
            size += HEADER.size + len(rec)
    parts[0] = HEADER.pack(size)
    return parts


def batch_body(batch: int, resend: bool, records: Sequence[Entry | bytes]) -> bytes:
    """A batch frame's body (without its length), joined."""
    return b"".join(batch_parts(batch, resend, records)[1:])


def encode_batch(batch: int, resend: bool, records: Sequence[Entry | bytes]) -> bytes:
    """A whole batch frame, its length first, joined."""
    return b"".join(batch_parts(batch, resend, records))


def split_batch(body: bytes) -> tuple[dict[str, Any], list[memoryview]]:
    """A batch frame's body: its header object and its records' bytes, unparsed."""
    view = memoryview(body)
    parts: list[memoryview] = []
    at = 0
    while at < len(view):
        if at + HEADER.size > len(view):
            raise ValueError("a batch frame ends inside a part's length")
        (size,) = HEADER.unpack_from(view, at)
        at += HEADER.size
        if at + size > len(view):
            raise ValueError("a batch frame ends inside a part")
        parts.append(view[at : at + size])
        at += size
    if not parts:
        raise ValueError("an empty batch frame")
    head = orjson.loads(parts[0])
    if not isinstance(head, dict) or head.get("records") != len(parts) - 1:
        raise ValueError(f"a batch frame's header does not match its {len(parts) - 1} records")
    return head, parts[1:]


def read_batch(stream: BinaryIO) -> tuple[dict[str, Any], list[Record]] | None:
    """The next batch frame: its header object and its records; None at the end of input."""
    body = read_body(stream)
    if body is None:
        return None
    head, parts = split_batch(body)
    return head, [to_record(orjson.loads(part)) for part in parts]


def encode_step(rec: Record) -> Entry:
    """A record as its entry in a batch frame, encoded once when it is offered: the queue
    then holds bytes, which the collector never walks, instead of the record's objects.

    Its raw values (``RawJson``: the request's bytes, the prompt's ids) are not copied into
    orjson's output: orjson writes a NUL byte where each goes (a byte it never writes
    itself: inside a string it escapes control characters) and the entry is the output's
    pieces with the values between them. Copied in, an agent step's ~100 KB grew orjson's
    buffer several times into memory the kernel had to fault in, record after record, while
    the queue held the ones before: with the batch's join, 149 CPU-µs and ~50 page faults
    a step against 10 µs and none (``bench.record_encoding``;
    docs/decisions/recorder-entry-parts.md).

    A prompt's ids as the request path cut them (``cut.PromptIds``) go in as a JSON
    *string* holding the array (the bytes were cut with their quotes): the writer
    process then parses one string, not some 10,000 ints, and compares its bytes with the
    session's previous prompt (``prompt_ref``); ``to_record`` turns it back into bytes."""
    raw: list[bytes] = []

    def hole(value: object) -> orjson.Fragment:
        if isinstance(value, PromptIds):
            data = value.quoted
        elif isinstance(value, RawJson):
            data = value.data
        else:
            raise TypeError(f"{type(value).__name__} is not JSON")
        raw.append(data if type(data) is bytes else bytes(data))  # held until written
        return _HOLE

    out = orjson.dumps(rec, default=hole)
    if not raw:
        return Entry((out,))
    pieces = out.split(b"\0")
    if len(pieces) != len(raw) + 1:  # cannot be: orjson escapes NUL wherever it writes one
        raise ValueError("a record's encoding holds a NUL byte of its own")
    parts = [pieces[0]]
    for value, piece in zip(raw, pieces[1:], strict=True):
        parts += (value, piece)
    return Entry(tuple(part for part in parts if part))


_HOLE = orjson.Fragment(b"\0")


def read_frame(stream: BinaryIO) -> Any | None:
    """The next frame's body parsed as one JSON document; None at the end of input."""
    body = read_body(stream)
    return None if body is None else orjson.loads(body)


def read_body(stream: BinaryIO) -> bytes | None:
    """The next frame's body; None at the end of input."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = stream.read(size)
    if len(body) < size:
        return None
    return body


def to_record(d: dict[str, Any]) -> StepRecord | ToolResultRecord:
    if d.get("kind") == "tool_result":
        return ToolResultRecord(**d)
    d["choices"] = [ChoiceCapture(**c) for c in d.get("choices") or ()]
    if isinstance(d.get("prompt_token_ids"), str):  # see ``encode_step``
        d["prompt_token_ids"] = RawJson(d["prompt_token_ids"].encode("ascii"))
    if d.get("chain") is not None:
        d["chain"] = ChainHashes(**d["chain"])
    return StepRecord(**d)


class BatchWriter:
    """Commits batches of records; retries lost connections; isolates refused records."""

    def __init__(self, engine: Engine, dead_letter: Path, writer: StepWriter) -> None:
        self.engine = engine
        self.dead_letter = dead_letter
        self.writer = writer

    def write(self, records: list[Record], resend: bool) -> tuple[int, int]:
        """(written, dead-lettered)."""
        if resend:
            records = self._not_yet_written(records)
        if not records:
            return 0, 0
        try:
            self._with_retry(lambda conn: self.writer.write(conn, records))
            return len(records), 0
        # The data, not the connection (or a bug on one record): isolate the bad record
        # rather than die on it and be restarted into the same batch forever.
        except Exception as exc:
            log.warning("batch of %d failed (%r); writing one by one", len(records), exc)
            self.writer.forget_caches()
        written = dead = 0
        for rec in records:
            try:
                self._with_retry(lambda conn, r=rec: self.writer.write(conn, [r]))  # type: ignore[misc]
                written += 1
            except Exception as one:
                self.writer.forget_caches()
                self._dead_letter(rec, one)
                dead += 1
        return written, dead

    def _not_yet_written(self, records: list[Record]) -> list[Record]:
        """Steps whose first id is not committed; every tool result (applying one twice is
        a no-op: see ``ToolCalls.sandbox_result``)."""
        ids = [r.step_ids[0] for r in records if isinstance(r, StepRecord)]
        with self.engine.connect() as conn:
            have = set(conn.execute(select(steps.c.id).where(steps.c.id.in_(ids))).scalars())
        return [r for r in records if not isinstance(r, StepRecord) or r.step_ids[0] not in have]

    def _with_retry(self, fn: Callable[[Connection], Any]) -> Any:
        """Run ``fn`` in a transaction; retry while the database is unreachable."""
        delay = 0.1
        while True:
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except OperationalError as exc:
                self.writer.forget_caches()  # they may name rows that were rolled back
                if not _is_connection_error(exc):
                    raise
                log.warning("store unreachable (%s); retrying in %.1fs", exc.orig, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except DBAPIError:
                self.writer.forget_caches()
                raise

    def _dead_letter(self, rec: Record, exc: Exception) -> None:
        log.error(
            "%s could not be written (%r); kept in %s",
            rec.describe(), exc, self.dead_letter,
            exc_info=not isinstance(exc, DBAPIError),  # a bug: keep its traceback
        )  # fmt: skip
        self.dead_letter.parent.mkdir(parents=True, exist_ok=True)
        with self.dead_letter.open("ab") as f:
            f.write(orjson.dumps(rec, default=_dead) + b"\n")


def _dead(value: object) -> object:
    """What a dead letter holds: raw JSON (a prompt's ids) as the JSON it is, else text."""
    return orjson.Fragment(value.data) if isinstance(value, RawJson) else str(value)


def _is_connection_error(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    return exc.connection_invalidated or any(
        m in text
        for m in ("connection", "server closed", "could not connect", "database is locked")
    )


def serve(url: str, dead_letter: Path, hooks: list[str], stdin: BinaryIO, stdout: BinaryIO) -> int:
    engine = make_engine(url)
    batches = BatchWriter(engine, dead_letter, StepWriter(load_hooks(hooks)))
    # The collector runs between batches, when nothing of one is alive: during a batch it
    # walked every element of every record's token ids (a batch of agent steps holds
    # millions) in pauses of 100-200 ms. What start-up built is frozen: never walked.
    gc.collect()
    gc.freeze()
    gc.disable()
    written_batches = 0
    try:
        while (batch := read_batch(stdin)) is not None:
            started = time.perf_counter()
            head, records = batch
            written, dead = batches.write(records, bool(head.get("resend")))
            ack = {"batch": head["batch"], "written": written, "dead": dead,
                   "seconds": time.perf_counter() - started}  # fmt: skip
            stdout.write(encode(ack))
            stdout.flush()
            del records, batch
            written_batches += 1
            gc.collect(2 if written_batches % FULL_COLLECTION_EVERY == 0 else 0)
    finally:
        engine.dispose()
    return 0


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )  # fmt: skip
    # Frames own stdout; anything else a library prints goes to stderr.
    frames = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    config = read_frame(sys.stdin.buffer)
    if config is None:
        return 0
    if config.get("cpus"):
        os.sched_setaffinity(0, set(config["cpus"]))
    # Background work: when a core is contended, requests go first and the queue absorbs it.
    os.nice(int(config.get("nice", 0)))
    dead_letter = Path(config["dead_letter"]).expanduser()
    return serve(config["url"], dead_letter, config["hooks"], sys.stdin.buffer, frames)


if __name__ == "__main__":
    raise SystemExit(main())
