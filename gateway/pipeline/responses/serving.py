"""``/v1/responses``: a response is one or more model steps served by the completion pipeline.

    prepare   ``turn.prepare``: everything that may refuse the request, before any model
              call or store write
    preface   before the first step: the new mcp_list_tools items, then the calls the
              request's approval answers decided (run, or told as denied)
    serve     per model step, CompletionPipeline (route, dispatch, escalate, answer |
              relay, finish: metrics, session state, the recorded step) with its ASGI
              ``send`` replaced by a translator (``capture``): the chat answer (or its
              stream, ``streaming``) becomes output items (or their events); hosted calls
              run in the sandbox and the next step sees them (``loop`` decides); the
              response object is stored before the client gets its end

The pipeline is not changed or copied: it serves a chat request and sends chat bytes,
which this module reads back. Its refusals (unknown model, tiers down, a budget, a kill
switch) raise or answer before anything is sent; to the first step they reach the client
as they are (the OpenAI error shape) and nothing is stored, unless calls ran before that
step (``LoopState.committed``): then, as for a later step, the response ends ``failed``
with the refusal's message and is stored with the calls that ran.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import Receive, Scope, Send

from gateway.errors import (
    GatewayError,
    ResourceNotFound,
    SandboxUnavailable,
    StoreUnavailable,
    UpstreamError,
)
from gateway.pipeline.handler import CompletionPipeline
from gateway.pipeline.outcome import CLIENT_CLOSED
from gateway.pipeline.request import RequestIdentity
from gateway.pipeline.responses import approvals, hosted, mcp_calls
from gateway.pipeline.responses import turn as prepared
from gateway.pipeline.responses.background import Background
from gateway.pipeline.responses.capture import JSON_HEADERS, Collected, error_message
from gateway.pipeline.responses.loop import WALL, Decision, LoopState, StepAnswer, not_run
from gateway.pipeline.responses.mcp_client import Target
from gateway.pipeline.responses.output import answer_items, usage
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.sandbox_offers import SandboxOffers
from gateway.pipeline.responses.streaming import serve_stream
from gateway.pipeline.responses.turn import Turn
from gateway.pipeline.responses.wall import WallClock
from gateway.pipeline.services import Services
from gateway.recording.recorder import RecorderClosed
from gateway.store import responses as stored
from gateway.store.queries import NotFound
from sandbox.protocol import ToolResult

__all__ = ["ResponsesService", "Turn"]
log = logging.getLogger(__name__)
T = TypeVar("T")


class ResponsesService:
    def __init__(self, services: Services, pipeline: CompletionPipeline) -> None:
        self.services = services
        self.pipeline = pipeline
        # the sandbox's listing and a key's held tools, reused for about a second
        self.sandbox_offers = SandboxOffers(services.settings.responses.sandbox_cache_s)
        self.background = Background(self, services.settings.responses.background_cap)

    async def prepare(self, request: ResponsesRequest, who: RequestIdentity) -> Turn:
        """Everything that may refuse the request, before any model call or store write."""
        return await prepared.prepare(self.services, request, who, self.call, self.sandbox_offers)

    def new_state(self, turn: Turn) -> LoopState:
        """The loop's caps: the request's, under its tenant's (``responses.tenants``, else
        the defaults): the lower ``max_tool_calls`` holds. The wall clock starts here."""
        r = turn.frame.request
        caps = self.services.settings.responses.caps(turn.parsed.identity.tenant)
        calls = [c for c in (r.max_tool_calls, caps.max_tool_calls) if c is not None]
        return LoopState(
            min(calls, default=None), r.max_output_tokens, caps.max_turns,
            caps.max_total_tokens, WallClock(caps.max_wall_s),
        )  # fmt: skip

    async def preface(self, turn: Turn, state: LoopState) -> None:
        """Before the first step: the new mcp_list_tools items, then the decided approval
        requests' calls (run, or denied) as output items the first step sees. From here
        on, the response is stored whatever its steps do (``committed``)."""
        state.output.extend(turn.mcp.listed)
        timeout = self.services.settings.responses.mcp.timeout_s
        who = turn.parsed.identity
        for decision in turn.decisions:
            if decision.approve and decision.request["server_label"] == hosted.SERVER_LABEL:
                item = approvals.call_item(decision)  # a sandbox tool: run as approved
                state.output.append(item)
                arguments = decision.request["arguments"]
                await hosted.run(self.services, who, turn.session, item, arguments, approved=True)
                continue
            ((item, result),) = await mcp_calls.preface([decision], turn.mcp.targets, timeout)
            state.output.append(item)
            await self._record(turn, item, result)
        state.committed = bool(turn.decisions)

    async def _record(self, turn: Turn, item: dict[str, Any], result: ToolResult) -> None:
        """An MCP call's result on the recorded tool call of the step that made it."""
        tenant = turn.parsed.identity.tenant
        text = item["output"] or ""
        await hosted.record(self.services, tenant, turn.session, item["call_id"], result, text)

    async def _mcp(self, turn: Turn, target: Target, item: dict[str, Any], arguments: str) -> None:
        timeout = self.services.settings.responses.mcp.timeout_s
        await self._record(turn, item, await mcp_calls.run(target, item, arguments, timeout))

    async def serve(self, turn: Turn, scope: Scope, receive: Receive, send: Send) -> None:
        if turn.parsed.stream:
            await serve_stream(self, turn, scope, receive, send)
            return
        last = Collected()
        response = await self.loop(turn, self.new_state(turn), scope, receive, last=last)
        if response is None:
            if last.status != CLIENT_CLOSED:  # the first step's error answer, passed on
                await last.replay(send)
            return  # or the client left: nothing to store, as with one step
        await self.store(turn, response, response["output"], strict=True)
        body = orjson.dumps(response)
        headers = [*(last.headers or JSON_HEADERS), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def loop(
        self, turn: Turn, state: LoopState, scope: Scope, receive: Receive, *,
        last: Collected | None = None, detached: bool = False,
    ) -> dict[str, Any] | None:  # fmt: skip
        """The model steps of a non-streamed response and the hosted calls between them;
        the response object at its end. None: the first step's refusal, to be passed on as
        it is (in ``last``), or the client left. ``detached`` (a background response, no
        client to pass anything on to) or calls that ran before the first step: the first
        step's refusal fails the response too."""
        await self.preface(turn, state)
        while True:
            got = Collected()
            passes_on = state.turns == 0 and not detached and not state.committed
            try:
                await self.pipeline(turn.step(state), scope, state.wall.bound(receive), got.send)
            except GatewayError as exc:
                if passes_on:
                    raise
                return self.failed(turn, state, exc.message)
            if state.wall.hit:  # stopped at the deadline: no answer to keep
                return self._ended(turn, state, state.stopped())
            if last is not None:
                got.copy_to(last)
            if got.status == CLIENT_CLOSED and not state.committed:
                return None
            if got.status != 200 and passes_on:
                return None
            if got.status != 200:
                return self.failed(turn, state, error_message(got.body))
            answer = self._answered(turn, got.body)
            state.output.extend(answer.items)
            decision = state.add(answer)
            try:
                await self.run_calls(turn, decision, answer, state.wall)
            except SandboxUnavailable as exc:
                return self.failed(turn, state, exc.message)
            decision = state.timed(decision)
            if decision.end:
                return self._ended(turn, state, decision)

    async def run_calls(
        self, turn: Turn, decision: Decision, answer: StepAnswer, wall: WallClock | None = None
    ) -> None:
        """Run the step's hosted calls (concurrently unless ``parallel_tool_calls`` is
        false); the ones a cap left out are settled as not run, and so are the ones of a
        one-by-one run that would start past the ``wall`` deadline (``wall.hit``)."""
        for item in decision.skipped:
            hosted.settle(item, not_run(decision.reason), ok=False, status="incomplete")
        who = turn.parsed.identity
        runs = [
            self._mcp(turn, target, item, answer.arguments[item["id"]])
            if (target := turn.mcp.targets.get(item.get("server_label", ""))) is not None
            and item["type"] == "mcp_call"
            else hosted.run(self.services, who, turn.session, item, answer.arguments[item["id"]])
            for item in decision.run
        ]
        if turn.frame.request.parallel_tool_calls is False:
            for item, run in zip(decision.run, runs, strict=True):
                if wall is not None and wall.expired:
                    run.close()  # never started
                    wall.hit = True
                    hosted.settle(item, not_run(WALL), ok=False, status="incomplete")
                    continue
                await run
            return
        results = await asyncio.gather(*runs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _answered(self, turn: Turn, body: bytes) -> StepAnswer:
        try:
            data = orjson.loads(body)
            choice = data["choices"][0]
            message, finish = choice["message"], choice.get("finish_reason")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise UpstreamError("the tier answered 200 without a chat completion") from None
        answer = StepAnswer([], finish, usage(data.get("usage")), data.get("model"))
        for item in answer_items(message, finish):
            claimed, arguments = hosted.claim(item, turn.kinds, turn.session)
            if arguments is not None:
                answer.arguments[claimed["id"]] = arguments
            answer.items.append(claimed)
        return answer

    @staticmethod
    def _ended(turn: Turn, state: LoopState, decision: Decision) -> dict[str, Any]:
        return turn.frame.response(
            decision.status, state.output, model=state.model, usage=state.usage,
            incomplete=decision.incomplete,
        )  # fmt: skip

    @staticmethod
    def failed(turn: Turn, state: LoopState, message: str) -> dict[str, Any]:
        error = {"code": "server_error", "message": message}
        return turn.frame.response(
            "failed", state.output, model=state.model, usage=state.usage, error=error
        )

    async def store(
        self, turn: Turn, response: dict[str, Any], output: list[dict[str, Any]], *, strict: bool
    ) -> None:
        """Store a finished response (``store`` true); ``strict``: a failure is the client's
        503 (nothing was sent yet), else it is logged (the stream has been sent)."""
        if not turn.frame.stored:
            return
        tenant = turn.parsed.identity.tenant
        row = stored.StoredResponse(
            turn.frame.id, turn.session, turn.frame.request.previous_response_id, response,
            turn.inputs, output,
        )  # fmt: skip
        try:
            await self.call(lambda c: stored.save(c, tenant, row))
        except (StoreUnavailable, SQLAlchemyError) as exc:
            if strict:
                raise StoreUnavailable(f"the response could not be stored: {exc}") from None
            log.error("response %s was streamed but could not be stored: %s", turn.frame.id, exc)

    async def call(self, fn: Callable[[Connection], T], param: str | None = None) -> T:
        """A store operation on the responses' own tables, run at once (not behind the
        recorder's queued steps: none of them touches these tables; measured, it was most
        of a stored response's time under load, docs/benchmarks.md); a missing (or another
        tenant's) response is a 404 naming ``param``."""
        if self.services.recorder is None:
            raise StoreUnavailable("responses are not stored: recording is off (store.enabled)")
        try:
            return await self.services.recorder.direct(fn)
        except NotFound as exc:
            raise ResourceNotFound(str(exc), param=param) from None
        except RecorderClosed as exc:
            raise StoreUnavailable(str(exc)) from None
