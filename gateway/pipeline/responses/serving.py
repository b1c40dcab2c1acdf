"""``/v1/responses``: one response is one model step, served by the completion pipeline.

    prepare   load the previous_response_id chain (store) → check and normalize the
              input items → chat messages → chat body → a ``ParsedRequest`` of the
              chain's session
    serve     CompletionPipeline (route, dispatch, escalate, answer | relay, finish:
              metrics, session state, the recorded step) with its ASGI ``send``
              replaced by a translator: the chat answer (or its stream) becomes the
              response object (or its events), which is stored before the client gets
              its end

The pipeline is not changed or copied: it serves a chat request and sends chat bytes,
which this module reads back. Its refusals (unknown model, tiers down) raise before
anything is sent and reach the client as errors; an upstream error answer is passed on
as it is (the OpenAI error shape). A chain is one trajectory session, named by the
client's ``X-Session-Id`` or else after the chain's first response id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import ResourceNotFound, StoreUnavailable, UpstreamError
from gateway.pipeline.handler import STREAM_HEADERS, CompletionPipeline
from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.responses import chat, items
from gateway.pipeline.responses.output import Frame, answer_items, status_of, usage
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.pipeline.services import Services
from gateway.recording.recorder import RecorderClosed
from gateway.store import responses as stored
from gateway.store.queries import NotFound
from gateway.upstream.sse import split_events

log = logging.getLogger(__name__)
T = TypeVar("T")
JSON_HEADERS = [(b"content-type", b"application/json")]
REPLACED = {b"content-length", b"content-type", b"cache-control"}


@dataclass(frozen=True, slots=True)
class Turn:
    """A prepared response: what it will say, the chat request that makes it, what it adds."""

    frame: Frame
    parsed: ParsedRequest
    inputs: list[dict[str, Any]]
    session: str


class ResponsesService:
    def __init__(self, services: Services, pipeline: CompletionPipeline) -> None:
        self.services = services
        self.pipeline = pipeline

    async def prepare(self, request: ResponsesRequest, who: RequestIdentity) -> Turn:
        """Everything that may refuse the request, before any model call or store write."""
        spec = chat.echo(request)
        chain = stored.Chain("", [])
        if request.previous_response_id is not None:
            prev = request.previous_response_id
            chain = await self.call(
                lambda c: stored.load_chain(c, who.tenant, prev), "previous_response_id"
            )
        inputs = items.normalize_input(request.input, (i["id"] for i in chain.items))
        messages = items.to_messages(chain.items, inputs, request.instructions)
        frame = Frame.new(request, spec, request.stored and self.services.recorder is not None)
        session = who.session_id or chain.session or frame.id
        identity = replace(who, endpoint="chat", requested_model=request.model, session_id=session)
        body = chat.chat_body(request, messages, spec)
        return Turn(frame, ParsedRequest(identity, body), inputs, session)

    async def serve(self, turn: Turn, scope: Scope, receive: Receive, send: Send) -> None:
        if turn.parsed.stream:
            out = _StreamOut(send, StreamTranslator(turn.frame))
            await self.pipeline(turn.parsed, scope, receive, out.send)
            if out.passthrough or not out.translator.ended:
                return  # an error answer passed on, or the client left: nothing to store
            events, response = out.translator.finish()
            await self._store(turn, response, out.translator.output, strict=False)
            await send({"type": "http.response.body", "body": events, "more_body": False})
            return
        got = _Collected()
        await self.pipeline(turn.parsed, scope, receive, got.send)
        if got.status != 200:
            await got.replay(send)
            return
        response = self._answered(turn, got.body)
        await self._store(turn, response, response["output"], strict=True)
        body = orjson.dumps(response)
        headers = [*got.headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _answered(self, turn: Turn, body: bytes) -> dict[str, Any]:
        try:
            data = orjson.loads(body)
            choice = data["choices"][0]
            message, finish = choice["message"], choice.get("finish_reason")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise UpstreamError("the tier answered 200 without a chat completion") from None
        status, incomplete = status_of(finish)
        return turn.frame.response(
            status, answer_items(message, finish), model=data.get("model"),
            usage=usage(data.get("usage")), incomplete=incomplete,
        )  # fmt: skip

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
        """A store operation, after the steps queued before it; a missing (or another
        tenant's) response is a 404 naming ``param``."""
        if self.services.recorder is None:
            raise StoreUnavailable("responses are not stored: recording is off (store.enabled)")
        try:
            return await self.services.recorder.call(fn)
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
    """The pipeline's chat stream, told as Responses events as it arrives; the end is
    sent by ``serve`` once the response is stored."""

    downstream: Send
    translator: StreamTranslator
    passthrough: bool = False  # the pipeline answered with an error, not a stream
    buffer: bytes = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] != 200 or not ctype.startswith(b"text/event-stream"):
                self.passthrough = True
                await self.downstream(message)
                return
            headers = _kept(list(message.get("headers", []))) + STREAM_HEADERS
            await self.downstream(
                {"type": "http.response.start", "status": 200, "headers": headers}
            )
            await self.downstream(
                {"type": "http.response.body", "body": self.translator.start(), "more_body": True}
            )
            return
        if self.passthrough:
            await self.downstream(message)
            return
        events, self.buffer = split_events(self.buffer + message.get("body", b""))
        out = b"".join(self.translator.feed(e) for e in events)
        if out:
            await self.downstream({"type": "http.response.body", "body": out, "more_body": True})
