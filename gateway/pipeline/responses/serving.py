"""``/v1/responses``: a response is one or more model steps served by the completion pipeline.

    prepare   load the previous_response_id chain (store) → check and normalize the
              input items → the hosted tools' schemas (sandbox) → chat messages → chat
              body → a ``ParsedRequest`` of the chain's session
    serve     per model step, CompletionPipeline (route, dispatch, escalate, answer |
              relay, finish: metrics, session state, the recorded step) with its ASGI
              ``send`` replaced by a translator: the chat answer (or its stream) becomes
              output items (or their events); hosted calls run in the sandbox and the
              next step sees them (``loop`` decides); the response object is stored
              before the client gets its end

The pipeline is not changed or copied: it serves a chat request and sends chat bytes,
which this module reads back. Its refusals (unknown model, tiers down) raise before
anything is sent and reach the client as errors; an upstream error answer to the first
step is passed on as it is (the OpenAI error shape), to a later step it fails the response.
A chain is one trajectory session, named by the client's ``X-Session-Id`` or else after the
chain's first response id; its sandbox session (the hosted tools' workspace) is the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import (
    GatewayError,
    ResourceNotFound,
    SandboxUnavailable,
    StoreUnavailable,
    UpstreamError,
)
from gateway.pipeline.handler import STREAM_HEADERS, CompletionPipeline
from gateway.pipeline.outcome import CLIENT_CLOSED
from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.responses import approvals, chat, hosted, items, mcp_calls
from gateway.pipeline.responses.background import Background
from gateway.pipeline.responses.loop import NOT_RUN, Decision, LoopState, StepAnswer
from gateway.pipeline.responses.mcp_calls import McpOffer
from gateway.pipeline.responses.mcp_client import Target
from gateway.pipeline.responses.output import Frame, answer_items, usage
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.pipeline.services import Services
from gateway.recording.recorder import RecorderClosed
from gateway.store import responses as stored
from gateway.store.queries import NotFound
from gateway.upstream.sse import split_events
from sandbox.protocol import ToolResult

log = logging.getLogger(__name__)
T = TypeVar("T")
JSON_HEADERS = [(b"content-type", b"application/json")]
REPLACED = {b"content-length", b"content-type", b"cache-control"}


@dataclass(frozen=True, slots=True)
class Turn:
    """A prepared response: what it will say, the chat request of its first step, what it
    adds, and what each later step is built from."""

    frame: Frame
    parsed: ParsedRequest
    inputs: list[dict[str, Any]]
    session: str
    history: Sequence[dict[str, Any]] = ()  # the chain's items
    kinds: dict[str, str] = field(default_factory=dict)  # hosted tools by function name
    offered: Sequence[Any] = ()  # their chat schemas
    mcp: McpOffer = field(default_factory=McpOffer)  # MCP servers, their new listings
    decisions: Sequence[approvals.Decision] = ()  # the chain's approval requests, decided

    def step(self, state: LoopState) -> ParsedRequest:
        """The chat request of the next model step: the chain, the input and the output so far."""
        if state.turns == 0 and not self.decisions:
            return self.parsed
        request = self.frame.request
        messages = items.to_messages(
            list(self.history), [*self.inputs, *state.output], request.instructions
        )
        body = chat.chat_body(
            request, messages, self.frame.spec, self.offered, first=state.turns == 0,
            max_tokens=state.tokens_left,
        )  # fmt: skip
        return ParsedRequest(self.parsed.identity, body)


class ResponsesService:
    def __init__(self, services: Services, pipeline: CompletionPipeline) -> None:
        self.services = services
        self.pipeline = pipeline
        self.background = Background(self)

    async def prepare(self, request: ResponsesRequest, who: RequestIdentity) -> Turn:
        """Everything that may refuse the request, before any model call or store write."""
        spec = chat.echo(request)
        mcp_settings = self.services.settings.responses.mcp
        servers = mcp_calls.targets(mcp_settings, who.tenant, spec.mcp)  # the allowlist
        kinds, offered = await hosted.offer(self.services, spec.hosted)
        chain = stored.Chain("", [])
        if request.previous_response_id is not None:
            prev = request.previous_response_id
            chain = await self.call(
                lambda c: stored.load_chain(c, who.tenant, prev), "previous_response_id"
            )
        inputs = items.normalize_input(request.input, (i["id"] for i in chain.items))
        decisions = approvals.resolve(
            chain.items, inputs, continuing=request.previous_response_id is not None,
            labels=set(servers), approver=f"client:{who.api_key}",
        )  # fmt: skip
        taken = [*kinds, *(t["name"] for t in spec.functions)]
        mcp = await mcp_calls.offer(mcp_settings, spec.mcp, servers, chain.items, taken)
        kinds, offered = kinds | mcp.kinds, [*offered, *mcp.offered]
        messages = items.to_messages(chain.items, inputs, request.instructions)
        frame = Frame.new(request, spec, request.stored and self.services.recorder is not None)
        session = who.session_id or chain.session or frame.id
        identity = replace(who, endpoint="chat", requested_model=request.model, session_id=session)
        body = chat.chat_body(request, messages, spec, offered)
        parsed = ParsedRequest(identity, body)
        return Turn(frame, parsed, inputs, session, chain.items, kinds, offered, mcp, decisions)

    def new_state(self, turn: Turn) -> LoopState:
        r = turn.frame.request
        return LoopState(r.max_tool_calls, r.max_output_tokens, self.max_turns)

    async def preface(self, turn: Turn, state: LoopState) -> None:
        """Before the first step: the new mcp_list_tools items, then the decided approval
        requests' calls (run, or denied) as output items the first step sees."""
        state.output.extend(turn.mcp.listed)
        timeout = self.services.settings.responses.mcp.timeout_s
        for item, result in await mcp_calls.preface(turn.decisions, turn.mcp.targets, timeout):
            state.output.append(item)
            await self._record(turn, item, result)

    async def _record(self, turn: Turn, item: dict[str, Any], result: ToolResult) -> None:
        """An MCP call's result on the recorded tool call of the step that made it."""
        tenant = turn.parsed.identity.tenant
        text = item["output"] or ""
        await hosted.record(self.services, tenant, turn.session, item["call_id"], result, text)

    async def _mcp(self, turn: Turn, target: Target, item: dict[str, Any], arguments: str) -> None:
        timeout = self.services.settings.responses.mcp.timeout_s
        await self._record(turn, item, await mcp_calls.run(target, item, arguments, timeout))

    @property
    def max_turns(self) -> int:
        return self.services.settings.responses.max_turns

    async def serve(self, turn: Turn, scope: Scope, receive: Receive, send: Send) -> None:
        if turn.parsed.stream:
            await self._serve_stream(turn, scope, receive, send)
            return
        last = _Collected()
        response = await self.loop(turn, self.new_state(turn), scope, receive, last=last)
        if response is None:
            if last.status != CLIENT_CLOSED:  # the first step's error answer, passed on
                await last.replay(send)
            return  # or the client left: nothing to store, as with one step
        await self._store(turn, response, response["output"], strict=True)
        body = orjson.dumps(response)
        headers = [*(last.headers or JSON_HEADERS), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def loop(
        self, turn: Turn, state: LoopState, scope: Scope, receive: Receive, *,
        last: _Collected | None = None, detached: bool = False,
    ) -> dict[str, Any] | None:  # fmt: skip
        """The model steps of a non-streamed response and the hosted calls between them;
        the response object at its end. None: the first step's refusal, to be passed on as
        it is (in ``last``), or the client left. ``detached`` (a background response, no
        client to pass anything on to): the first step's refusal fails the response too."""
        await self.preface(turn, state)
        while True:
            got = _Collected()
            try:
                await self.pipeline(turn.step(state), scope, receive, got.send)
            except GatewayError as exc:
                if state.turns == 0 and not detached:
                    raise
                return self.failed(turn, state, exc.message)
            if last is not None:
                last.status, last.headers, last.raw_headers = (
                    got.status,
                    got.headers,
                    got.raw_headers,
                )
                last.body = got.body
            if got.status == CLIENT_CLOSED or (
                got.status != 200 and state.turns == 0 and not detached
            ):
                return None
            if got.status != 200:
                return self.failed(turn, state, _error_message(got.body))
            answer = self._answered(turn, got.body)
            state.output.extend(answer.items)
            decision = state.add(answer)
            try:
                await self._run(turn, decision, answer)
            except SandboxUnavailable as exc:
                return self.failed(turn, state, exc.message)
            if decision.end:
                return self._ended(turn, state, decision)

    async def _serve_stream(self, turn: Turn, scope: Scope, receive: Receive, send: Send) -> None:
        translator = StreamTranslator(turn.frame, turn.kinds, turn.session)
        out = _StreamOut(send, translator)
        state = self.new_state(turn)
        state.output = translator.output  # one list: the translator adds, the loop counts
        await self.preface(turn, state)  # told when the stream starts
        while True:
            out.refused = None
            try:
                await self.pipeline(turn.step(state), scope, receive, out.send)
            except GatewayError as exc:
                if not out.started:
                    raise
                final = self._stream_failed(translator, state, exc.message)
                break
            if out.passthrough or out.refused_status == CLIENT_CLOSED:
                return  # an error answer passed on, or the client left: nothing to store
            if out.refused is not None:
                final = self._stream_failed(translator, state, _error_message(out.refused))
                break
            if not translator.ended:
                return  # the client left mid-stream
            events, answer = translator.close_step()
            await out.body(events)
            if answer.error is not None:
                state.add(answer)
                final = self._stream_failed(translator, state, answer.error["message"])
                break
            decision = state.add(answer)
            await out.body(translator.running(decision.run))
            try:
                await self._run(turn, decision, answer)
            except SandboxUnavailable as exc:
                await out.body(translator.settled([*decision.run, *decision.skipped]))
                final = self._stream_failed(translator, state, exc.message)
                break
            await out.body(translator.settled([*decision.run, *decision.skipped]))
            if decision.end:
                final = translator.end(
                    decision.status, usage=state.usage, model=state.model,
                    incomplete=decision.incomplete,
                )  # fmt: skip
                break
        events, response = final
        await self._store(turn, response, translator.output, strict=False)
        await send({"type": "http.response.body", "body": events, "more_body": False})

    async def _run(self, turn: Turn, decision: Decision, answer: StepAnswer) -> None:
        """Run the step's hosted calls (concurrently unless ``parallel_tool_calls`` is
        false); the ones over ``max_tool_calls`` are settled as not run."""
        for item in decision.skipped:
            hosted.settle(item, NOT_RUN, ok=False, status="incomplete")
        who = turn.parsed.identity
        runs = [
            self._mcp(turn, target, item, answer.arguments[item["id"]])
            if (target := turn.mcp.targets.get(item.get("server_label", ""))) is not None
            and item["type"] == "mcp_call"
            else hosted.run(self.services, who, turn.session, item, answer.arguments[item["id"]])
            for item in decision.run
        ]
        if turn.frame.request.parallel_tool_calls is False:
            for run in runs:
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

    @staticmethod
    def _stream_failed(
        translator: StreamTranslator, state: LoopState, message: str
    ) -> tuple[bytes, dict[str, Any]]:
        error = {"code": "server_error", "message": message}
        return translator.end("failed", usage=state.usage, model=state.model, error=error)

    async def _store(
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


def _kept(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The pipeline's headers (request id, tier, route reason, step id) for our own body."""
    return [(k, v) for k, v in headers if k.lower() not in REPLACED]


@dataclass(slots=True)
class _Collected:
    """A non-streamed pipeline answer, held back to be translated."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.raw_headers = list(message.get("headers", []))
            self.headers = _kept(self.raw_headers) + JSON_HEADERS
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    async def replay(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.body})


@dataclass(slots=True)
class _StreamOut:
    """The pipeline's chat stream of each step, told as Responses events as it arrives;
    the end is sent by ``serve`` once the response is stored."""

    downstream: Send
    translator: StreamTranslator
    started: bool = False  # the client has the stream's start
    passthrough: bool = False  # the first step answered with an error, not a stream
    refused: bytes | None = None  # a later step's error answer (the stream had begun)
    refused_status: int = 0
    buffer: bytes = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            sse = message["status"] == 200 and ctype.startswith(b"text/event-stream")
            if self.started:  # a later step: its start is not the client's
                if not sse:
                    self.refused, self.refused_status = b"", message["status"]
                return
            if not sse:
                self.passthrough = True
                await self.downstream(message)
                return
            self.started = True
            headers = _kept(list(message.get("headers", []))) + STREAM_HEADERS
            await self.downstream(
                {"type": "http.response.start", "status": 200, "headers": headers}
            )
            await self.body(self.translator.start())
            return
        if self.passthrough:
            await self.downstream(message)
            return
        if self.refused is not None:
            self.refused += message.get("body", b"")
            return
        events, self.buffer = split_events(self.buffer + message.get("body", b""))
        await self.body(b"".join(self.translator.feed(e) for e in events))

    async def body(self, events: bytes) -> None:
        if events:
            await self.downstream({"type": "http.response.body", "body": events, "more_body": True})


def _error_message(body: bytes) -> str:
    """The message of an error answer (the OpenAI shape), for a response that failed."""
    try:
        error = orjson.loads(body)["error"]
        return str(error["message"]) if isinstance(error, dict) else str(error)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode(errors="replace")[:500] or "the tier failed"
