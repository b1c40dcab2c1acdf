"""Background responses (``background: true``): created, stored and answered at once, run
detached by the gateway, polled with ``GET /v1/responses/{id}``, stopped with
``POST /v1/responses/{id}/cancel``.

    create    the request is prepared as any other (every refusal is the client's 4xx/503
              before anything is stored); the response is stored ``queued`` with its input
              items and returned; an asyncio task owned by ``Background`` runs its loop
    run       stored ``in_progress``, then the hosted loop of a non-streamed response
              (``ResponsesService.loop``) with no client to send to: a tier's refusal or
              any failure ends it ``failed`` with the error; its end is stored with its
              output items, only if it is still active
    cancel    the task of this gateway is cancelled and stores ``cancelled`` with the
              output it had; a response no task here holds (another replica's, or one a
              killed gateway left active) is marked ``cancelled`` in the store, and its
              run, wherever it is, then stores nothing
    shutdown  ``close`` (the router's lifespan, before the recorder closes) cancels every
              task: each stores ``failed``, saying that the gateway shut down

    stream    ``stream: true`` too: the run is the streamed loop (``streaming.run_steps``)
              writing to an ``EventLog`` instead of a client; the client that created it
              reads the log, and so may any other (``follow``: ``GET /v1/responses/{id}
              ?stream=true&starting_after=N``) while it runs and ``KEEP_S`` after; a
              reader leaving never stops the run (only ``cancel`` does)

A background response must be stored (``store: false`` is a 400, as OpenAI answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError
from starlette.types import Message, Scope

from gateway.errors import GatewayError, InvalidRequest, RateLimited, StoreUnavailable
from gateway.pipeline.responses.capture import StreamOut
from gateway.pipeline.responses.event_log import EventLog
from gateway.pipeline.responses.loop import LoopState
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.pipeline.responses.streaming import run_steps
from gateway.store import responses as stored

if TYPE_CHECKING:
    from gateway.pipeline.responses.serving import ResponsesService, Turn

log = logging.getLogger(__name__)
SHUTDOWN = "the gateway shut down while this background response ran"
KEEP_S = 300.0  # a streamed run's events stay readable this long after its end
Key = tuple[str, str]  # tenant, response id
# What the pipeline reads of its ASGI scope; no disconnect ever comes (nobody waits).
SCOPE: Scope = {
    "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
    "method": "POST", "path": "/v1/responses", "headers": [], "extensions": {},
}  # fmt: skip


async def _no_disconnect() -> Message:
    await asyncio.Event().wait()  # until the task is cancelled
    raise AssertionError("unreachable")


class Background:
    """The background responses this gateway runs, by tenant and id."""

    def __init__(self, service: ResponsesService, cap: Callable[[str], int]) -> None:
        self.service = service
        self.cap = cap  # background runs a tenant may have here (responses.max_background)
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        self.reasons: dict[Key, str] = {}  # why a task was cancelled: SHUTDOWN, else the client
        self.logs: dict[Key, EventLog] = {}  # streamed runs' events
        self.starting: Counter[str] = Counter()  # by tenant: being stored, not yet running

    def running(self, tenant: str) -> int:
        """The tenant's background responses running here, or being started."""
        return sum(1 for t, _ in self.tasks if t == tenant) + self.starting[tenant]

    async def start(self, turn: Turn) -> dict[str, Any]:
        """Store the response ``queued`` and start its run; the object the client gets. A
        tenant at its cap (``responses.max_background``) gets a 429 and nothing is stored."""
        tenant = turn.parsed.identity.tenant
        cap = self.cap(tenant)
        if self.running(tenant) >= cap:
            raise RateLimited(
                f"{cap} background responses of this tenant are running on this gateway "
                "(responses.max_background): wait for one to end or cancel one",
                param="background",
                headers={"retry-after": "1"},
            )
        self.starting[tenant] += 1  # counted while the store write below is awaited
        try:
            return await self._start(turn, tenant)
        finally:
            self.starting[tenant] -= 1

    async def _start(self, turn: Turn, tenant: str) -> dict[str, Any]:
        queued = turn.frame.response("queued", [])
        row = stored.StoredResponse(
            turn.frame.id, turn.session, turn.frame.request.previous_response_id, queued,
            turn.inputs, [],
        )  # fmt: skip
        await self.service.call(lambda c: stored.save(c, tenant, row))
        key = (tenant, turn.frame.id)
        if turn.parsed.stream:
            self.logs[key] = EventLog()
        task = asyncio.create_task(self._run(turn, key), name=f"background {turn.frame.id}")
        self.tasks[key] = task
        task.add_done_callback(lambda _: self.tasks.pop(key, None))
        return queued

    async def _run(self, turn: Turn, key: Key) -> None:
        service = self.service
        state = service.new_state(turn)
        events = self.logs.get(key)
        end = b""  # a streamed run's last event, told once the response is stored
        try:
            running = turn.frame.response("in_progress", [])
            if not await self._write(key, lambda c: stored.set_active(c, key[0], key[1], running)):
                return  # cancelled or deleted before it began
            if events is not None:
                end, response = await self._streamed(turn, state, events)
            else:
                got = await service.loop(turn, state, SCOPE, _no_disconnect, detached=True)
                # detached: no client to leave, no refusal passed on
                response = got or service.failed(turn, state, "the first step was not answered")
        except asyncio.CancelledError:
            await self._finish(turn, key, self._stopped(turn, state, self.reasons.pop(key, "")))
            self._ended(key)
            raise
        except Exception as exc:  # a bug or an unforeseen failure: the response says so
            log.error("background response %s failed", key[1], exc_info=exc)
            message = exc.message if isinstance(exc, GatewayError) else f"internal error: {exc!r}"
            response = service.failed(turn, state, message)
        await self._finish(turn, key, response)
        if events is not None:
            events.write(end)
        self._ended(key)

    async def _streamed(
        self, turn: Turn, state: LoopState, events: EventLog
    ) -> tuple[bytes, dict[str, Any]]:
        """The streamed loop, told to ``events``; its last event and the response."""
        translator = StreamTranslator(turn.frame, turn.kinds, turn.session)
        state.output = translator.output  # one list: the translator adds, the loop counts
        await self.service.preface(turn, state)
        out = StreamOut(events.send, translator, hold=True)  # no client to pass a refusal to
        await out.begin([])
        final = await run_steps(self.service, turn, state, out, SCOPE, _no_disconnect)
        if final is None:  # held: not reached
            return b"", self.service.failed(turn, state, "the first step was not answered")
        return final

    def _ended(self, key: Key) -> None:
        """A streamed run's log: closed now, forgotten ``KEEP_S`` later."""
        events = self.logs.get(key)
        if events is None:
            return
        events.close()
        loop = asyncio.get_running_loop()
        loop.call_later(
            KEEP_S, lambda: self.logs.pop(key, None) if self.logs.get(key) is events else None
        )

    def follow(self, tenant: str, response_id: str, starting_after: int) -> AsyncIterator[bytes]:
        """The events of a streamed background response this gateway runs (or ran within
        ``KEEP_S``), after the sequence number ``starting_after``."""
        events = self.logs.get((tenant, response_id))
        if events is None:
            raise InvalidRequest(
                f"response {response_id!r} has no stream here: only a background response "
                f"created with stream: true can be streamed, while it runs and {KEEP_S:.0f} s "
                "after (on the gateway that runs it); retrieve it without stream",
                param="stream",
            )
        return events.follow(starting_after)

    @staticmethod
    def _stopped(turn: Turn, state: LoopState, reason: str) -> dict[str, Any]:
        for item in state.output:  # a hosted call cut short
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"
        if reason == SHUTDOWN:
            error = {"code": "server_error", "message": SHUTDOWN}
            return turn.frame.response(
                "failed", state.output, model=state.model, usage=state.usage, error=error
            )
        return turn.frame.response("cancelled", state.output, model=state.model, usage=state.usage)

    async def _finish(self, turn: Turn, key: Key, response: dict[str, Any]) -> None:
        row = stored.StoredResponse(
            turn.frame.id, turn.session, turn.frame.request.previous_response_id, response,
            turn.inputs, response["output"],
        )  # fmt: skip
        if not await self._write(key, lambda c: stored.finish(c, key[0], row)):
            log.info("background response %s ended %s; not stored: no longer active (cancelled or "
                     "deleted meanwhile)", key[1], response["status"])  # fmt: skip

    async def _write(self, key: Key, fn: Callable[[Any], bool]) -> bool:
        """A store write of the run; it is not interrupted by a cancel that comes meanwhile
        (the cancel waits for the run's end, which this write may be)."""
        try:
            return await asyncio.shield(self.service.call(fn))
        except (StoreUnavailable, SQLAlchemyError, GatewayError) as exc:
            log.error("background response %s: the store failed: %s", key[1], exc)
            return False

    async def cancel(self, tenant: str, response_id: str) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: the cancelled response object."""
        key = (tenant, response_id)
        task = self.tasks.get(key)
        if task is not None and task.cancel():
            await asyncio.wait([task])  # it stores ``cancelled`` with its output so far
        return await self.service.call(
            lambda c: stored.cancel(c, tenant, response_id), "response_id"
        )

    def forget(self, tenant: str, response_id: str) -> None:
        """Stop the run of a response being deleted (its end would not be stored anyway)."""
        task = self.tasks.get((tenant, response_id))
        if task is not None:
            task.cancel()
        events = self.logs.pop((tenant, response_id), None)
        if events is not None:
            events.close()  # its readers end

    async def close(self, timeout_s: float = 10) -> None:
        """Cancel every run; each stores ``failed`` (SHUTDOWN) before the store closes."""
        tasks = list(self.tasks.items())
        for key, task in tasks:
            self.reasons[key] = SHUTDOWN
            task.cancel()
        if tasks:
            log.warning("shutting down: %d background responses stopped", len(tasks))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait([t for _, t in tasks], timeout=timeout_s)
