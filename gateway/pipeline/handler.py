"""The completion pipeline, one way through:

    route → context (opt-in) → upstream body → dispatch (retries, fallback) → escalate → answer | relay
          → outcome → finish (session state, metrics, calibration, span, recorder)

Parsing and authentication happen before, in ``gateway.http.completions``, which hands a
``ParsedRequest`` in; admission (key scope, rate limits, budget reservation:
``gateway.access.admission``) comes first here, so that every model step of a Responses
loop passes it too; its ticket is settled by finish, or released on the way out. Each
stage takes typed values and returns new ones; the only accumulator is dispatch's
``Attempts``, frozen into the outcome. However a request ends (answered, streamed, failed,
abandoned by its client), one ``Outcome`` is built for it and finished once.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.access.admission import Ticket
from gateway.errors import GatewayError, ShuttingDown
from gateway.pipeline import escalation
from gateway.pipeline.answer import Answer, answer, parsed_body, stream_capture
from gateway.pipeline.finish import Finish
from gateway.pipeline.outcome import CLIENT_CLOSED, Captured, Outcome, Served, StepPlan, headers
from gateway.pipeline.record import plan_step
from gateway.pipeline.request import ParsedRequest
from gateway.pipeline.route import RouteStage, Routing
from gateway.pipeline.services import Services
from gateway.pipeline.span import start_span
from gateway.pipeline.upstream_body import UpstreamRequest, build_upstream_request
from gateway.upstream.dispatch import Attempts, Completed, OpenStream
from gateway.upstream.relay import StreamEnd, StreamRelay, wait_disconnect
from router import Tier

log = logging.getLogger(__name__)
STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class ClientGone(Exception):
    """The client disconnected while the request was still being dispatched."""


class CompletionPipeline:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.route = RouteStage(
            services.control, services.route_sessions, services.pools, services.scraper,
            services.token_calibrator, services.metrics,
        )  # fmt: skip
        self.context = services.context
        self.finish = Finish(
            services.metrics, services.route_sessions, services.token_calibrator,
            services.recorder,
        )  # fmt: skip

    async def __call__(
        self, parsed: ParsedRequest, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve ``parsed``. A ``GatewayError`` raised out of here was raised before
        anything was sent: the caller answers it (``gateway.http.errors``)."""
        who = parsed.identity
        try:
            ticket = await self.services.admission.admit(
                who.tenant, who.api_key, parsed.body, parsed.raw
            )
        except GatewayError as exc:  # refused before any tier was chosen
            self.services.metrics.requests.labels(who.endpoint, "none", str(exc.status)).inc()
            raise
        if ticket is None:
            await self._serve(parsed, scope, receive, send, None)
            return
        try:
            await self._serve(parsed, scope, receive, send, ticket)
        finally:
            ticket.release()  # a no-op once finish settled it

    async def _serve(
        self, parsed: ParsedRequest, scope: Scope, receive: Receive, send: Send,
        ticket: Ticket | None,
    ) -> None:  # fmt: skip
        try:
            who = parsed.identity
            keys = await self.services.route_sessions.known(who.tenant, who.session_id, parsed.body)
            routing = self.route(parsed, keys)
            context = self.context.wanted(parsed, scope)
        except GatewayError as exc:  # refused before any tier was chosen
            endpoint = parsed.identity.endpoint
            self.services.metrics.requests.labels(endpoint, "none", str(exc.status)).inc()
            raise
        if context is not None:
            routing = await self.context(parsed, routing, context)
        recording = self.services.recorder is not None
        condensed = routing.context.messages if routing.context is not None else None
        upstream = build_upstream_request(parsed, capture=recording, messages=condensed)
        step = plan_step(parsed.body) if recording else None
        span = start_span(self.services.tracer, parsed.identity, parsed.body)
        attempts = Attempts(routing.tier)
        try:
            result = await self._dispatch(
                receive, parsed, upstream, attempts, routing.allow_fallback
            )
            escalated = None
            if isinstance(result, Completed) and routing.allow_fallback:
                result, escalated = await self._escalate(
                    receive, parsed, upstream, attempts, result
                )
        except (ClientGone, GatewayError) as exc:
            failed = _failed(parsed, routing, attempts, exc, step)
            await self.finish(failed, span, ticket)
            if isinstance(exc, GatewayError):
                raise
            await Response(status_code=CLIENT_CLOSED)(scope, receive, send)
            return
        served = Served.of(attempts, escalated)
        if isinstance(result, OpenStream):
            end, captured, answers, stopped = await self._relay(
                parsed, routing, upstream, result, attempts, served, step, receive, send, ticket
            )
            served = Served.of(attempts, escalated)  # the relay waited on the replica too
            await self.finish(
                _streamed(parsed, routing, served, end, captured, answers, step), span, ticket
            )
            if stopped:
                raise asyncio.CancelledError  # the server is stopping; the stream is recorded
            return
        chain = routing.keys.history is not None
        reply = answer(
            result, parsed.identity.endpoint, upstream.wants, chain, parsed.identity.request_id
        )
        outcome = _answered(parsed, routing, served, reply, step)
        await self.finish(outcome, span, ticket)  # before the answer: its step is queued then
        hdrs = headers(parsed.identity.request_id, routing, served, step, outcome.overhead_ms())
        if ticket is not None:
            hdrs.update(ticket.headers)  # a budget past its soft threshold
        response = Response(reply.body, reply.status, hdrs, media_type="application/json")
        await response(scope, receive, send)

    async def _dispatch(
        self,
        receive: Receive,
        parsed: ParsedRequest,
        upstream: UpstreamRequest,
        attempts: Attempts,
        allow_fallback: bool,
    ) -> Completed | OpenStream:
        """Dispatch while watching the client: if it leaves first, the upstream request is
        cancelled (vLLM aborts it) and ``ClientGone`` is raised."""
        work = asyncio.ensure_future(
            self.services.dispatcher.dispatch(
                upstream.payload, upstream.path, upstream.stream, attempts,
                allow_fallback=allow_fallback, request_id=parsed.identity.request_id,
            )
        )  # fmt: skip
        watch = asyncio.ensure_future(wait_disconnect(receive))
        # the client leaving cancels the work (which closes the upstream connection: vLLM
        # aborts the request); a done-callback, not ``asyncio.wait`` (~7 µs a request less)
        watch.add_done_callback(lambda w: w.cancelled() or work.cancel())
        try:
            return await work  # cancelled here (the server is stopping): the work goes too
        except asyncio.CancelledError:
            if watch.done() and not watch.cancelled():
                raise ClientGone from None
            raise
        finally:
            watch.cancel()

    async def _escalate(
        self,
        receive: Receive,
        parsed: ParsedRequest,
        upstream: UpstreamRequest,
        attempts: Attempts,
        result: Completed,
    ) -> tuple[Completed, str | None]:
        """Re-run on the full tier a fast-tier answer that fails validation, before the
        client sees it (``gateway.pipeline.escalation``)."""
        services = self.services
        if (
            attempts.tier is not Tier.FAST
            or attempts.fallback  # the full tier just failed: the fast answer is the one
            or result.status != 200
            or not services.settings.router.escalate
            or Tier.FULL not in services.pools
        ):
            return result, None
        found = escalation.problem(parsed.body, parsed_body(result, parsed.identity.endpoint))
        if found is None:
            return result, None
        kind, why = found
        services.metrics.escalations.labels(kind).inc()
        log.info(
            "request %s: fast-tier answer escalated to full (%s)", parsed.identity.request_id, why
        )
        attempts.tier = Tier.FULL
        again = await self._dispatch(receive, parsed, upstream, attempts, allow_fallback=False)
        assert isinstance(again, Completed)
        return again, why

    async def _relay(
        self,
        parsed: ParsedRequest,
        routing: Routing,
        upstream: UpstreamRequest,
        result: OpenStream,
        attempts: Attempts,
        served: Served,
        step: StepPlan | None,
        receive: Receive,
        send: Send,
        ticket: Ticket | None,
    ) -> tuple[StreamEnd, Captured | None, tuple[object, ...] | None, bool]:
        """Relay the stream; what the capture assembled (recorded requests), the messages
        for an unnamed session's chain (when the stream ended well), and whether the
        server cancelled it (stopping)."""
        who = parsed.identity
        chain = routing.keys.history is not None
        capture = stream_capture(who.endpoint, upstream.wants, chain)
        hdrs = headers(
            who.request_id, routing, served, step, who.elapsed_ms() - served.upstream_s * 1000
        )
        if ticket is not None:
            hdrs.update(ticket.headers)
        relay = StreamRelay(
            result, [(k.encode(), v.encode()) for k, v in hdrs.items()] + STREAM_HEADERS,
            self.services.settings.timeouts, attempts, strip_usage=upstream.strip_usage,
            rewrite=capture.on_event if capture is not None else None, request_id=who.request_id,
        )  # fmt: skip
        stopped = False
        try:
            end = await relay.run(receive, send)
        except asyncio.CancelledError:
            stopped = True
            end = relay.ended(ShuttingDown("the gateway stopped while the answer was streaming"))
        if capture is None:
            return end, None, None, stopped
        choices = capture.choices()
        captured = (
            Captured(capture.prompt_token_ids, choices, capture.model, end.kv_compaction)
            if upstream.wants is not None
            else None
        )
        ok = end.error is None and not end.client_gone
        answers = tuple(c.message for c in choices) if chain and ok else None
        return end, captured, answers, stopped


def _failed(
    parsed: ParsedRequest,
    routing: Routing,
    attempts: Attempts,
    exc: ClientGone | GatewayError,
    step: StepPlan | None,
) -> Outcome:
    served = Served.of(attempts)
    if isinstance(exc, ClientGone):
        return Outcome(parsed, routing, served, CLIENT_CLOSED, client_gone=True, step=step)
    return Outcome(parsed, routing, served, exc.status, error=exc.message, step=step)


def _answered(
    parsed: ParsedRequest, routing: Routing, served: Served, reply: Answer, step: StepPlan | None
) -> Outcome:
    return Outcome(
        parsed, routing, served, reply.status,
        prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
        finish_reasons=reply.finish_reasons, response_model=reply.model, error=reply.error,
        captured=reply.captured, answers=reply.answers, step=step,
    )  # fmt: skip


def _streamed(
    parsed: ParsedRequest,
    routing: Routing,
    served: Served,
    end: StreamEnd,
    captured: Captured | None,
    answers: tuple[object, ...] | None,
    step: StepPlan | None,
) -> Outcome:
    return Outcome(
        parsed, routing, served, CLIENT_CLOSED if end.client_gone else 200,
        prompt_tokens=end.prompt_tokens, completion_tokens=end.completion_tokens,
        finish_reasons=tuple(c.finish_reason or "" for c in captured.choices) if captured else (),
        response_model=captured.model if captured else None, first_byte_at=end.first_byte_at,
        error=end.error, stream_error=end.error_kind, client_gone=end.client_gone,
        captured=captured, answers=answers, step=step,
    )  # fmt: skip
