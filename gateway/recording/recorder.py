"""The recorder: a bounded queue on the request path, a writer process behind it.

The request path only builds a ``StepRecord`` and offers it (``record``), which encodes
it at once into its entry of a writer frame: what waits in the queue is bytes (an
``Entry``: the record's JSON around its raw values, which are not copied). A sandbox
result for a tool call a queued or written step made goes the same way
(``tool_result``: a ``ToolResultRecord``, in order after that step). A
consumer task takes whatever has queued up (waiting up to ``linger_s`` for more,
at most ``batch_size`` steps and about ``batch_mb``), sends it to the writer process
(``gateway.recording.writer_process``) and waits for its acknowledgement, which
comes after the commit. Under load batches grow on their own while the writer
is busy.

The queue is bounded twice: in steps (``queue_size``) and in bytes (``queue_mb``:
an agent step, whole history and prompt ids, is about a hundred times a chat
step). When either is reached the configured policy applies: ``wait`` holds the
request for up to ``wait_s`` (backpressure), then drops; ``drop`` drops at
once. Every drop is counted (``gearshift_recorder_dropped_total``) and logged:
never silent. If the writer process dies it is restarted and the unacknowledged
batch is sent again (records already committed are skipped).

Other store operations (feedback, session start and end, reads) go through the
same queue: the consumer runs them, in this process, once every step queued
before them is acknowledged, so they see those steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection, Engine

from gateway.config import StoreSettings
from gateway.metrics import Metrics
from gateway.recording import writer_priority
from gateway.recording.records import StepRecord, ToolResultRecord
from gateway.recording.writer_priority import WATCH_S, IdleSchedule, StarvationWatch
from gateway.recording.writer_process import (
    HEADER,
    Entry,
    Record,
    batch_parts,
    encode,
    encode_step,
)
from gateway.store.database import make_engine, prepare_schema

log = logging.getLogger(__name__)

T = TypeVar("T")
FLUSH_TIMEOUT_S = 60
LOW_NICE = 10  # how much nicer the low-priority reader is (``read(low=True)``)
KNOWN_SESSIONS = 100_000  # named sessions whose tool call ids are kept for ``tool_result``


def _lower_priority() -> None:
    """This thread ``LOW_NICE`` nicer than the process (Linux: niceness is per thread);
    where that cannot be done, as it is."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + LOW_NICE)
        )


def _bytes(item: Entry | _Op) -> int:
    return item.size if isinstance(item, Entry) else 0


class RecorderClosed(Exception):
    """The recorder is shutting down and takes no more work."""


class _Op:
    """A store operation queued behind the steps offered before it."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[Connection], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future


class WriterGone(Exception):
    """The writer process ended or broke the protocol."""


class Recorder:
    def __init__(self, settings: StoreSettings, metrics: Metrics, hooks: list[str] | None = None):
        self.settings = settings
        self.metrics = metrics
        self.hooks = list(hooks or [])
        self.engine: Engine | None = None  # this process's, for operations and reads
        self._queue: asyncio.Queue[Entry | _Op] = asyncio.Queue()  # bounded by _fits
        self._queued_bytes = 0
        self._room = asyncio.Condition()  # notified when the consumer takes steps
        # (tenant, client session name) -> ids of the tool calls its offered steps made
        self._calls: OrderedDict[tuple[str, str], set[str]] = OrderedDict()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-ops")
        self._low = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="store-low", initializer=_lower_priority
        )
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._batch = 0
        self._carry: Entry | _Op | None = None  # taken from the queue, first of the next batch
        self._closing = False
        self._dropped_logged_at = 0.0
        self._idle = IdleSchedule(settings.writer_idle, settings.writer_nice)
        self._watch: asyncio.Task[None] | None = None
        self._rescuing = False  # the writer was killed for starving, not lost

    @property
    def writer_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Bring the schema up to date (or refuse an old one), then start the writer."""
        loop = asyncio.get_running_loop()
        s = self.settings
        await loop.run_in_executor(self._thread, prepare_schema, s.url, s.migrate)
        self.engine = await loop.run_in_executor(self._thread, make_engine, s.url)
        await self._spawn()
        self._task = asyncio.create_task(self._consume(), name="recorder")
        if self._idle.enabled:
            self._watch = asyncio.create_task(self._watch_writer(), name="recorder-watch")
        elif s.writer_idle:
            log.info(
                "recorder: the writer runs at niceness %d, not idle priority (this process "
                "could not bring it back if it starved: no CAP_SYS_NICE, or no schedstat)",
                s.writer_nice,
            )  # fmt: skip

    async def _spawn(self) -> None:
        s = self.settings
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.recording.writer_process",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self._proc.stdin is not None
        config = {"url": s.url, "dead_letter": s.dead_letter_path, "cpus": s.writer_cpus, "nice": s.writer_nice,
                  "hooks": self.hooks}  # fmt: skip
        self._proc.stdin.write(encode(config))

    async def close(self) -> None:
        """Stop taking work, write everything queued, stop the writer, release the database."""
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._task is not None:
            done = asyncio.get_running_loop().create_future()
            await self._queue.put(_Op(lambda conn: None, done))
            try:
                await asyncio.wait_for(asyncio.shield(done), FLUSH_TIMEOUT_S)
            except TimeoutError:  # the database is down: say what is lost, do not hang
                left = self._queue.qsize()
                self.metrics.recorder_dropped.labels("closing").inc(left)
                log.error(
                    "recorder: the store did not take the last %d queued steps within %ds; "
                    "they are lost (gearshift_recorder_dropped_total{reason=\"closing\"})",
                    left, FLUSH_TIMEOUT_S,
                )  # fmt: skip
            except Exception:
                log.exception("recorder: flushing on shutdown failed")
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # end of input: the writer exits
            try:
                await asyncio.wait_for(self._proc.wait(), 30)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self.engine is not None:
            self.engine.dispose()
        self._thread.shutdown(wait=True)
        self._low.shutdown(wait=True)

    # -- request path -----------------------------------------------------

    async def record(self, rec: Record) -> bool:
        """Offer a step (or a tool result); False when it was dropped (counted and logged)."""
        if self._closing:
            return self._drop(rec, "closing")
        if isinstance(rec, StepRecord):
            self._remember_calls(rec)
        step = encode_step(rec)
        if self._fits(step):
            self._put(step)
            return True
        if self.settings.on_full == "wait":
            try:
                async with asyncio.timeout(self.settings.wait_s), self._room:
                    await self._room.wait_for(lambda: self._fits(step))
                    self._put(step)
                return True
            except TimeoutError:
                pass
        return self._drop(rec, "queue_full")

    def _remember_calls(self, rec: StepRecord) -> None:
        """The tool calls of a named session's step, for ``tool_result``."""
        made = rec.call_ids() if rec.external_session is not None else None
        if not made:
            return
        key = (rec.tenant, str(rec.external_session))
        self._calls.setdefault(key, set()).update(made)
        self._calls.move_to_end(key)
        if len(self._calls) > KNOWN_SESSIONS:
            self._calls.popitem(last=False)

    async def tool_result(
        self, tenant: str, session: str, call_id: str, outcome: dict[str, Any]
    ) -> bool | None:
        """Queue a sandbox result for a tool call this gateway recorded (its step offered
        here, in this process's lifetime): True when queued, False when dropped; None when
        the call is not known here (the caller then looks in the store)."""
        if call_id not in self._calls.get((tenant, session), ()):
            return None
        return await self.record(ToolResultRecord(tenant, session, call_id, outcome, time.time()))

    def _fits(self, step: Entry) -> bool:
        """Room for ``step`` in both bounds (one step always fits an empty queue)."""
        if self._queue.qsize() >= self.settings.queue_size:
            return False
        limit = self.settings.queue_mb * 1_000_000
        return self._queued_bytes == 0 or self._queued_bytes + step.size <= limit

    def _put(self, step: Entry) -> None:
        self._queue.put_nowait(step)
        self._queued_bytes += step.size

    def _drop(self, rec: Record, why: str) -> bool:
        self.metrics.recorder_dropped.labels(why).inc()
        now = time.monotonic()
        if now - self._dropped_logged_at > 5.0:
            self._dropped_logged_at = now
            log.warning(
                "recorder dropped %s (%s; queue %d/%d steps, %.1f/%d MB, on_full=%s); "
                "see gearshift_recorder_dropped_total",
                rec.describe(), why, self._queue.qsize(), self.settings.queue_size,
                self._queued_bytes / 1e6, self.settings.queue_mb,
                self.settings.on_full,
            )  # fmt: skip
        return False

    async def call(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in a transaction after every step queued before it is committed."""
        if self._closing or self._task is None:
            raise RecorderClosed("the trajectory store is not running")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Op(fn, future))  # operations come from few callers: unbounded
        return await future

    async def direct(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in a transaction now, not behind the queued steps: for tables
        no step writes and that need no step committed first (the Responses API's own).
        Such operations keep their order among themselves (one thread runs them all)."""
        if self._closing or self._task is None or self.engine is None:
            raise RecorderClosed("the trajectory store is not running")
        engine = self.engine

        def run() -> T:
            with engine.begin() as conn:
                return fn(conn)

        return await asyncio.get_running_loop().run_in_executor(self._thread, run)

    async def read(self, fn: Callable[[Connection], T], low: bool = False) -> T:
        """Run ``fn(conn)`` on a connection of its own in a worker thread: for reads that
        may take a while (reports, the dashboard, the agent metrics) and must hold up
        neither the steps' writer nor the ordered operations of ``direct``. ``low``: on
        one thread at niceness ``LOW_NICE`` (periodic work nobody waits for: SQLite runs
        a query without the interpreter lock, so at normal priority it takes the core
        from the event loop's requests)."""
        if self._closing or self._task is None or self.engine is None:
            raise RecorderClosed("the trajectory store is not running")
        engine = self.engine

        def run() -> T:
            with engine.connect() as conn:
                return fn(conn)

        if low:
            return await asyncio.get_running_loop().run_in_executor(self._low, run)
        return await asyncio.to_thread(run)

    # -- the consumer -----------------------------------------------------

    async def _consume(self) -> None:
        while True:
            batch = await self._collect()
            taken = sum(_bytes(item) for item in batch)
            self._queued_bytes -= taken
            self.metrics.recorder_queued.set(self._queue.qsize())
            self.metrics.recorder_queued_bytes.set(self._queued_bytes)
            if taken:
                async with self._room:
                    self._room.notify_all()
            run: list[Entry] = []
            for item in batch:
                if isinstance(item, Entry):
                    run.append(item)
                    continue
                await self._send(run)
                run = []
                await self._run_op(item)
            await self._send(run)

    async def _collect(self) -> list[Entry | _Op]:
        """The next batch: what is queued after lingering linger_s, at most batch_size
        steps and about batch_mb of them (a step that would pass it starts the next batch).

        One sleep per batch rather than a timeout per item: under load the linger is
        what makes batches large, and a timer per step would cost more than it saves.
        The byte bound keeps the frame, built and written on the event loop, small: 256
        agent steps are ~25 MB, and a frame that size held the loop for 30-40 ms
        (docs/decisions/recorder-frame-size.md).
        """
        first = self._carry if self._carry is not None else await self._queue.get()
        self._carry = None
        linger = (
            self.settings.linger_s > 0
            and not isinstance(first, _Op)
            and not self._closing
            and self._queue.qsize() < self.settings.batch_size - 1
        )
        if linger:
            await asyncio.sleep(self.settings.linger_s)
        batch = [first]
        size, limit = _bytes(first), self.settings.batch_mb * 1_000_000
        while len(batch) < self.settings.batch_size and not self._queue.empty():
            item = self._queue.get_nowait()
            if size + _bytes(item) > limit:
                self._carry = item  # first of the next batch: the order is kept
                break
            batch.append(item)
            size += _bytes(item)
        return batch

    async def _send(self, records: list[Entry]) -> None:
        """Hand records to the writer and wait for its commit; survive its death."""
        if not records:
            return
        self._batch += 1
        resend = False
        delay = 0.1
        while True:
            try:
                ack = await self._exchange(batch_parts(self._batch, resend, records))
                break
            except WriterGone as exc:
                self.metrics.recorder_retries.inc()
                if not self._rescuing:
                    log.error("recorder: writer process failed (%s); restarting it", exc)
                self._rescuing = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                await self._spawn()
                resend = True
        self.metrics.recorder_written.inc(ack["written"])
        if ack["dead"]:
            self.metrics.recorder_dropped.labels("write_failed").inc(ack["dead"])
        self.metrics.recorder_batch.observe(len(records))
        self.metrics.recorder_commit.observe(ack["seconds"])

    async def _watch_writer(self) -> None:
        """Keep the writer at idle priority while it is served; bring back one that
        starves there (gateway.recording.writer_priority)."""
        watch = StarvationWatch()
        rescued: int | None = None  # a writer killed for starving, until it is gone
        while True:
            await asyncio.sleep(WATCH_S)
            proc = self._proc
            if proc is None or proc.returncode is not None or proc.pid == rescued:
                continue
            try:
                if self._idle.due() and not writer_priority.is_idle(proc.pid):
                    writer_priority.set_idle(proc.pid)
                if not watch.starved(proc.pid):
                    continue
                cooldown = self._idle.rescued()
                self.metrics.recorder_writer_starved.inc()
                if writer_priority.set_normal(proc.pid):
                    # what a saturated core does to it: expected under load, not a fault
                    log.info(
                        "recorder: the writer starved at idle priority (its core is busy); "
                        "at niceness %d for %.0fs", self.settings.writer_nice, cooldown,
                    )  # fmt: skip
                    continue
                log.warning(
                    "recorder: the writer starved at idle priority and could not be brought "
                    "back; restarting it at niceness %d (idle again in %.0fs)",
                    self.settings.writer_nice, cooldown,
                )  # fmt: skip
                rescued, self._rescuing = proc.pid, True
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # it dies when it next gets the CPU
            except Exception:  # a bug here must not end the watch, nor the recorder
                log.exception("recorder: watching the writer's priority failed")

    async def _exchange(self, frame: list[bytes]) -> dict[str, Any]:
        """Write a batch frame (its parts, as ``batch_parts`` made them: written as they
        are, not joined) and read the writer's acknowledgement."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise WriterGone("not started")
        try:
            proc.stdin.writelines(frame)
            await proc.stdin.drain()
            (size,) = HEADER.unpack(await proc.stdout.readexactly(HEADER.size))
            ack: dict[str, Any] = orjson.loads(await proc.stdout.readexactly(size))
            return ack
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise WriterGone(f"exit status {proc.returncode}: {exc!r}") from exc

    async def _run_op(self, op: _Op) -> None:
        engine = self.engine
        assert engine is not None

        def run() -> Any:
            with engine.begin() as conn:
                return op.fn(conn)

        try:
            result = await asyncio.get_running_loop().run_in_executor(self._thread, run)
        except Exception as exc:  # handed to the awaiting coroutine, which maps it
            if not op.future.done():
                op.future.set_exception(exc)
            return
        if not op.future.done():
            op.future.set_result(result)
