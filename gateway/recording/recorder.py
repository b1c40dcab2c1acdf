"""The recorder: a bounded queue in front of one writer thread that commits in batches.

The request path only builds a ``StepRecord`` and offers it (``record``). A
consumer task takes whatever has queued up, up to ``batch_size``, and commits
it in one transaction on a single worker thread: under load batches grow on
their own, so writes per second scale with load while each request pays one
queue put.

When the queue is full the configured policy applies: ``wait`` holds the
request for up to ``wait_s`` (backpressure), then drops; ``drop`` drops at
once. Every drop is counted (``gearshift_recorder_dropped_total``) and logged:
never silent. A batch that fails on a lost connection is retried with backoff;
one that fails on its data is written record by record, and records that still
fail go to a dead-letter file as JSON lines, also counted.

Other store operations (feedback, session start and end, reads) go through the
same queue as barriers, so they see every step recorded before them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from gateway.config import StoreSettings
from gateway.metrics import Metrics
from gateway.recording.records import StepRecord
from gateway.recording.rewards import load_hooks
from gateway.recording.writer import StepWriter
from gateway.store.database import make_engine, prepare_schema

log = logging.getLogger(__name__)

T = TypeVar("T")


class RecorderClosed(Exception):
    """The recorder is shutting down and takes no more work."""


class _Op:
    """A store operation queued behind the steps offered before it."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[Connection], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future


class Recorder:
    def __init__(self, settings: StoreSettings, metrics: Metrics, hooks: list[str] | None = None):
        self.settings = settings
        self.metrics = metrics
        self.engine: Engine | None = None
        self._writer = StepWriter(load_hooks(hooks or []))
        self._queue: asyncio.Queue[StepRecord | _Op] = asyncio.Queue(settings.queue_size)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recorder")
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._dropped_logged_at = 0.0

    async def start(self) -> None:
        """Bring the schema up to date (or refuse an old one), then start writing."""
        loop = asyncio.get_running_loop()
        s = self.settings
        await loop.run_in_executor(self._thread, prepare_schema, s.url, s.migrate)
        self.engine = await loop.run_in_executor(self._thread, make_engine, s.url)
        self._task = asyncio.create_task(self._consume(), name="recorder")

    async def close(self) -> None:
        """Stop taking work, write everything queued, release the database."""
        self._closing = True
        if self._task is not None:
            await self._queue.put(
                _Op(lambda conn: None, asyncio.get_running_loop().create_future())
            )
            await self._queue.join()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.engine is not None:
            self.engine.dispose()
        self._thread.shutdown(wait=True)

    # -- request path -----------------------------------------------------

    async def record(self, rec: StepRecord) -> bool:
        """Offer a step; False when it was dropped (counted and logged)."""
        if self._closing:
            return self._drop(rec, "closing")
        try:
            self._queue.put_nowait(rec)
            self.metrics.recorder_queued.set(self._queue.qsize())
            return True
        except asyncio.QueueFull:
            pass
        if self.settings.on_full == "wait":
            try:
                async with asyncio.timeout(self.settings.wait_s):
                    await self._queue.put(rec)
                return True
            except TimeoutError:
                pass
        return self._drop(rec, "queue_full")

    def _drop(self, rec: StepRecord, why: str) -> bool:
        self.metrics.recorder_dropped.labels(why).inc()
        now = time.monotonic()
        if now - self._dropped_logged_at > 5.0:
            self._dropped_logged_at = now
            log.warning(
                "recorder dropped request %s (%s; queue %d/%d, on_full=%s); "
                "see gearshift_recorder_dropped_total",
                rec.request_id,
                why,
                self._queue.qsize(),
                self.settings.queue_size,
                self.settings.on_full,
            )
        return False

    async def call(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` in a transaction after every step queued before it is written."""
        if self._closing or self._task is None:
            raise RecorderClosed("the trajectory store is not running")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Op(fn, future))
        return await future

    # -- the writer side --------------------------------------------------

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        size, linger = self.settings.batch_size, self.settings.linger_s
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + linger
            while len(batch) < size:
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0 or isinstance(batch[-1], _Op) or self._closing:
                    break  # operations are answered at once
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        batch.append(await self._queue.get())
            try:
                await loop.run_in_executor(self._thread, self._write_batch, batch)
            except Exception:  # a bug in the writer must not stop recording for good
                log.exception("recorder: unexpected failure writing a batch of %d", len(batch))
            finally:
                for _ in batch:
                    self._queue.task_done()
                self.metrics.recorder_queued.set(self._queue.qsize())

    def _write_batch(self, batch: list[StepRecord | _Op]) -> None:
        """Steps in runs, each run one transaction; operations one by one, in order."""
        run: list[StepRecord] = []
        for item in batch:
            if isinstance(item, StepRecord):
                run.append(item)
                continue
            self._write_steps(run)
            run = []
            self._run_op(item)
        self._write_steps(run)

    def _write_steps(self, records: list[StepRecord]) -> None:
        if not records:
            return
        started = time.perf_counter()
        try:
            self._with_retry(lambda conn: self._writer.write(conn, records))
        except DBAPIError as exc:  # the data, not the connection: isolate the bad record
            log.warning("recorder: batch of %d failed (%s); writing one by one", len(records), exc)
            for rec in records:
                try:
                    self._with_retry(lambda conn, r=rec: self._writer.write(conn, [r]))  # type: ignore[misc]
                except DBAPIError as one:
                    self._dead_letter(rec, one)
                    continue
                self.metrics.recorder_written.inc()
            return
        self.metrics.recorder_written.inc(len(records))
        self.metrics.recorder_batch.observe(len(records))
        self.metrics.recorder_commit.observe(time.perf_counter() - started)

    def _with_retry(self, fn: Callable[[Connection], Any]) -> Any:
        """Run ``fn`` in a transaction; retry while the database is unreachable."""
        assert self.engine is not None
        delay, attempts = 0.1, 0
        while True:
            attempts += 1
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except OperationalError as exc:
                self._writer.forget_caches()  # they may name rows that were rolled back
                if not _is_connection_error(exc) or (self._closing and attempts >= 5):
                    raise
                self.metrics.recorder_retries.inc()
                log.warning("recorder: store unreachable (%s); retrying in %.1fs", exc.orig, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except DBAPIError:
                self._writer.forget_caches()
                raise

    def _run_op(self, op: _Op) -> None:
        loop = op.future.get_loop()
        try:
            result = self._with_retry(op.fn)
        except Exception as exc:  # handed to the awaiting coroutine, which maps it
            loop.call_soon_threadsafe(_set, op.future, None, exc)
            return
        loop.call_soon_threadsafe(_set, op.future, result, None)

    def _dead_letter(self, rec: StepRecord, exc: Exception) -> None:
        self.metrics.recorder_dropped.labels("write_failed").inc()
        path = Path(self.settings.dead_letter_path).expanduser()
        log.error(
            "recorder: request %s could not be written (%s); kept in %s", rec.request_id, exc, path
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.write(orjson.dumps(asdict(rec), default=str) + b"\n")


def _set(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _is_connection_error(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    return exc.connection_invalidated or any(
        m in text
        for m in ("connection", "server closed", "could not connect", "database is locked")
    )
