"""The logic behind the completion endpoints: read, validate, route, dispatch, answer.

``Gateway`` owns everything a request needs (pools, HTTP session, policy,
metrics, tracer). It is built without I/O by the app factory; ``start`` and
``close`` run in the app's lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
from opentelemetry import trace
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from gateway import escalation
from gateway.auth import Authenticator
from gateway.config import Settings
from gateway.context import RequestContext
from gateway.dispatch import Completed, Dispatcher, OpenStream, upstream_message
from gateway.errors import GatewayError, InvalidRequest, ModelNotFound, PayloadTooLarge
from gateway.metrics import Metrics
from gateway.pool import TierPool
from gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    describe,
    note_unknown_fields,
)
from gateway.recording.capture import StreamCapture, Wants
from gateway.recording.recorder import Recorder
from gateway.recording.step import PendingStep
from gateway.relay import StreamRelay, wait_disconnect
from gateway.route_state import RouteSessions, continuation_keys, load_signals
from gateway.scrape import Scraper
from gateway.telemetry import build_tracer_provider, end_span, start_span
from gateway.token_calibration import TokenCalibrator
from gateway.upstream import new_session
from router import Decision, RouteRequest, Tier, build_policy
from router.step_features import request_counts, request_prompt_tokens
from router.tokens import Anchor, position
from sandbox.client import SandboxClient

log = logging.getLogger(__name__)

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
VALIDATORS: dict[str, type[SamplingFields]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
}
CLIENT_CLOSED = 499  # nginx's convention: the client went away before the answer


class ClientGone(Exception):
    """The client disconnected while the request was still being dispatched."""


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.auth = Authenticator(settings.auth)
        self.policy = build_policy(settings.router.policy, settings.router.params)
        self.route_sessions = RouteSessions(
            settings.router.max_sessions, settings.router.session_ttl_s
        )
        self.pools = {
            tier: TierPool(
                tier, ts.model, ts.replicas, settings.breaker, settings.health, fallback=ts.fallback
            )
            for tier, ts in settings.tiers.items()
        }
        self.models: dict[str, Tier] = {}
        for tier, ts in settings.tiers.items():
            self.models[ts.model] = tier
            self.models.setdefault(tier.value, tier)  # "full"/"fast" pin a tier too
        self.scraper = Scraper(self.pools, self.metrics, settings.telemetry.scrape_interval_s)
        counted_by = self.pools.get(Tier.FULL) or next(iter(self.pools.values()), None)
        self.token_calibrator = TokenCalibrator(
            counted_by if settings.router.calibrate_tokens else None
        )
        self.tracer_provider = tracer_provider or build_tracer_provider(settings.telemetry)
        self.tracer = self.tracer_provider.get_tracer("gearshift")
        self.created = int(time.time())
        self._session: aiohttp.ClientSession | None = None
        self._unknown_fields: set[str] = set()  # already logged as forwarded unknown
        self._dispatcher: Dispatcher | None = None
        self.sandbox: SandboxClient | None = None  # set when `serve` runs the tool sandbox
        self.recorder = (
            Recorder(settings.store, self.metrics, settings.rewards.hooks)
            if settings.store.enabled
            else None
        )

    async def start(self) -> None:
        if self.recorder is not None:
            await self.recorder.start()
        sb = self.settings.sandbox
        if sb.enabled and sb.token is not None:  # run by `serve`, or a sandbox deployed apart
            socket = str(sb.socket) if sb.socket is not None else None
            url = f"http://{sb.host}:{sb.port}"
            self.sandbox = SandboxClient(url, sb.token.get_secret_value(), socket=socket)
        self._session = new_session(self.settings.timeouts)
        self._dispatcher = Dispatcher(
            self.pools, self._session, self.settings.timeouts, self.settings.retries, self.metrics
        )
        for pool in self.pools.values():
            pool.start_health_checks(self._session)
        self.scraper.start(self._session)
        self.token_calibrator.start(self._session)

    async def close(self) -> None:
        await self.scraper.stop()
        await self.token_calibrator.stop()
        for pool in self.pools.values():
            await pool.stop()
        if self._session is not None:
            await self._session.close()
        if self.sandbox is not None:
            await self.sandbox.close()
        if self.recorder is not None:
            await self.recorder.close()  # after the pools: every finished step is queued
        shutdown = getattr(self.tracer_provider, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def ready(self) -> bool:
        return bool(self.pools) and all(p.ready() for p in self.pools.values())

    # -- request path ------------------------------------------------------

    async def handle(self, request: Request, endpoint: str) -> Response:
        state = request.state
        ctx = RequestContext(state.request_id, state.t0, endpoint, requested_model="")
        try:
            body, allow_fallback = await self._prepare(request, ctx)
        except GatewayError as exc:  # refused before any tier was chosen
            self.metrics.requests.labels(endpoint, "none", str(exc.status)).inc()
            raise
        stream = bool(body.get("stream"))
        step = PendingStep(ctx, body) if self.recorder is not None else None
        strip_usage = False
        if stream and not (body.get("stream_options") or {}).get("include_usage"):
            # Ask for usage anyway (metrics, recording); the relay drops that chunk.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            strip_usage = True
        span = start_span(self.tracer, ctx, body)
        try:
            result = await self._dispatch_or_disconnect(
                request.receive, ctx, body, stream, allow_fallback
            )
            if isinstance(result, Completed) and allow_fallback and ctx.tier is Tier.FAST:
                result = await self._escalate(request.receive, ctx, body, result)
        except ClientGone:
            self.metrics.client_disconnects.labels(str(ctx.tier)).inc()
            self._finish(ctx, span, CLIENT_CLOSED, stream, None)
            await self._record(step, ctx, CLIENT_CLOSED)
            return Response(status_code=CLIENT_CLOSED)
        except GatewayError as exc:
            ctx.error = exc.message
            self._finish(ctx, span, exc.status, stream, None)
            await self._record(step, ctx, exc.status)
            raise
        if isinstance(result, OpenStream):
            return self._stream_response(ctx, span, result, strip_usage, step)
        return await self._complete_response(ctx, span, result, stream, step)

    async def _escalate(
        self, receive: Receive, ctx: RequestContext, body: dict[str, Any], result: Completed
    ) -> Completed:
        """Re-run a fast-tier answer that fails validation on the full tier (before commit)."""
        if not self.settings.router.escalate or result.status != 200 or Tier.FULL not in self.pools:
            return result
        try:
            result.data = orjson.loads(result.body)  # kept: the response path reuses it
        except orjson.JSONDecodeError:
            return result
        found = escalation.problem(body, result.data)
        if found is None:
            return result
        kind, why = found
        self.metrics.escalations.labels(kind).inc()
        log.info("request %s: fast-tier answer escalated to full (%s)", ctx.request_id, why)
        ctx.escalated, ctx.tier = why, Tier.FULL
        again = await self._dispatch_or_disconnect(receive, ctx, body, False, False)
        assert isinstance(again, Completed)
        return again

    async def _record(self, step: PendingStep | None, ctx: RequestContext, status: int) -> None:
        if step is not None and self.recorder is not None:
            await self.recorder.record(step.record(ctx, status))

    async def _prepare(self, request: Request, ctx: RequestContext) -> tuple[dict[str, Any], bool]:
        """Authenticate, read, validate and route; returns the body and whether fallback is allowed."""
        principal = self.auth.authenticate(request.headers.get("authorization"))
        body = await self._read_json(request)
        self._validate(ctx.endpoint, body)
        ctx.requested_model = body["model"]
        ctx.tenant = principal.tenant
        ctx.api_key = principal.key_name
        headers = request.headers
        ctx.task_id = headers.get("x-gearshift-task-id")
        ctx.group_id = headers.get("x-gearshift-group-id")
        ctx.session_id = request.headers.get("x-session-id") or body.get("user")
        return body, self._route(ctx, body)

    async def _read_json(self, request: Request) -> dict[str, Any]:
        limit = self.settings.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(
                f"request body of {declared} bytes exceeds the limit of {limit} bytes"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw:
            raise InvalidRequest("request body is empty; send a JSON object")
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidRequest(f"request body must be a JSON object, not {type(data).__name__}")
        return data

    def _validate(self, endpoint: str, body: dict[str, Any]) -> None:
        try:
            VALIDATORS[endpoint].model_validate(body)
        except ValidationError as exc:
            message, param = describe(exc)
            raise InvalidRequest(message, param=param) from None
        note_unknown_fields(endpoint, body, self._unknown_fields)

    def _route(self, ctx: RequestContext, body: dict[str, Any]) -> bool:
        """Pick the tier; returns whether falling back to the other tier is allowed."""
        model = ctx.requested_model
        if model == "auto":
            keys = self.route_sessions.keys(ctx.tenant or "default", ctx.session_id, body)
            ctx.route_keys = keys
            session = self.route_sessions.get(ctx.tenant or "default", keys.key)
            load = load_signals(self.pools, self.scraper)
            started = time.perf_counter()
            request = RouteRequest(
                ctx.endpoint, body, keys.key, session, load,
                tokens=self.token_calibrator.model,
            )  # fmt: skip
            try:
                decision = self.policy.decide(request)
                ctx.route_counts = request_counts(request)  # computed once, shared
                ctx.route_tokens = request_prompt_tokens(request)
                ctx.route_position = position(body)
            except Exception as exc:  # a routing bug must not fail the request
                log.exception("routing policy failed on request %s", ctx.request_id)
                why = f"policy error ({type(exc).__name__}): full tier"
                decision = Decision(Tier.FULL, why, "error")
            self.metrics.route_decision.observe(time.perf_counter() - started)
            if decision.tier not in self.pools:  # one-tier deployments
                only = next(iter(self.pools))
                decision = replace(decision, tier=only, reason=decision.reason + "; only tier")
            ctx.decision, ctx.tier = decision, decision.tier
            self.metrics.routes.labels(decision.tier, decision.policy).inc()
            return True
        ctx.route_keys = self.route_sessions.keys(ctx.tenant or "default", ctx.session_id, body)
        tier = self.models.get(model)
        if tier is None:
            known = ", ".join(["auto", *sorted(self.models)])
            raise ModelNotFound(
                f"model {model!r} does not exist; available: {known}", param="model"
            )
        ctx.tier = tier
        self.metrics.routes.labels(tier, "pinned").inc()
        return False  # a pinned tier is never silently replaced

    async def _dispatch_or_disconnect(
        self,
        receive: Receive,
        ctx: RequestContext,
        body: dict[str, Any],
        stream: bool,
        allow_fallback: bool,
    ) -> Completed | OpenStream:
        assert self._dispatcher is not None, "Gateway.start() was not called"
        work = asyncio.ensure_future(
            self._dispatcher.dispatch(ctx, body, PATHS[ctx.endpoint], stream, allow_fallback)
        )
        watch = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is stopping: the upstream request goes too
            work.cancel()
            raise
        finally:
            watch.cancel()
        if not work.done():
            work.cancel()  # closes the upstream connection: vLLM aborts the request
            await asyncio.gather(work, return_exceptions=True)
            raise ClientGone
        return work.result()

    def _headers(self, ctx: RequestContext, step: PendingStep | None) -> dict[str, str]:
        headers = {
            "x-request-id": ctx.request_id,
            "x-gearshift-tier": str(ctx.tier),
            "x-gearshift-route-reason": ctx.route_reason,
            "x-gearshift-overhead-ms": f"{ctx.overhead_ms():.3f}",
        }
        if step is not None:
            headers["x-gearshift-step-id"] = step.header()
        return headers

    async def _complete_response(
        self,
        ctx: RequestContext,
        span: Any,
        result: Completed,
        stream: bool,
        step: PendingStep | None,
    ) -> Response:
        response_model = None
        body = result.body
        record = None
        if result.status == 200:
            response_model, data = self._note_usage(ctx, result)
            if step is not None and data is not None:
                body, record = step.answer(ctx, data, body)
        elif not _is_openai_error(result.body):
            body = _wrap_error(result)
        self._finish(ctx, span, result.status, stream, response_model)
        response = Response(
            body, result.status, self._headers(ctx, step), media_type="application/json"
        )
        if step is not None and self.recorder is not None:
            if record is None:
                ctx.error = ctx.error or (
                    None if result.status == 200 else upstream_message(result.body)
                )
                record = step.record(ctx, result.status)
            await self.recorder.record(record)
        return response

    def _note_usage(
        self, ctx: RequestContext, result: Completed
    ) -> tuple[str | None, dict[str, Any] | None]:
        """The served model's name and the parsed answer (None when it is not a JSON object)."""
        try:
            data = result.data if result.data is not None else orjson.loads(result.body)
            usage = data.get("usage") or {}
            ctx.prompt_tokens = usage.get("prompt_tokens")
            ctx.completion_tokens = usage.get("completion_tokens")
            ctx.finish_reasons = [c.get("finish_reason") or "" for c in data.get("choices") or ()]
            if ctx.route_keys is not None and ctx.route_keys.history is not None:
                ctx.answers = [c.get("message") for c in data.get("choices") or ()]
            model = data.get("model")
            return (model if isinstance(model, str) else None), data
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            log.warning(
                "request %s: upstream answered 200 with a body that is not a JSON object",
                ctx.request_id,
            )
            return None, None

    def _stream_response(
        self,
        ctx: RequestContext,
        span: Any,
        result: OpenStream,
        strip_usage: bool,
        step: PendingStep | None,
    ) -> StreamRelay:
        headers = [(k.encode(), v.encode()) for k, v in self._headers(ctx, step).items()]
        headers += [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]

        capture = step.stream if step is not None else None
        keys = ctx.route_keys
        if capture is None and keys is not None and keys.history is not None:
            # not recorded, but an unnamed session's next step finds its history by the
            # answer: assemble it (the events pass through unchanged)
            capture = StreamCapture(ctx.endpoint, Wants(logprobs=True, token_ids=True))

        async def finish(ctx: RequestContext, error: str | None, client_gone: bool) -> None:
            if error is not None:
                self.metrics.stream_errors.labels(str(ctx.tier), error).inc()
            if client_gone:
                self.metrics.client_disconnects.labels(str(ctx.tier)).inc()
            status = CLIENT_CLOSED if client_gone else 200
            if error is None and capture is not None:
                ctx.answers = [c.message for c in capture.choices()]  # the chain's next links
            self._finish(ctx, span, status, True, None)
            if step is not None and self.recorder is not None:
                await self.recorder.record(step.streamed(ctx, status))

        return StreamRelay(
            ctx, result, headers, self.settings.timeouts, strip_usage, finish, capture
        )

    def _finish(
        self, ctx: RequestContext, span: Any, status: int, stream: bool, model: str | None
    ) -> None:
        now = time.perf_counter()
        tier = str(ctx.tier) if ctx.tier is not None else "none"
        if ctx.tier is not None and status != CLIENT_CLOSED and ctx.route_keys is not None:
            keys = ctx.route_keys
            answers = ctx.answers if status == 200 else None
            self.route_sessions.finish(
                ctx.tenant or "default", keys, ctx.tier,
                escalated=ctx.escalated is not None, failed=status >= 500,
                anchor=_anchor(ctx),
                continuations=continuation_keys(keys.history, answers) if answers else (),
            )  # fmt: skip
        m = self.metrics
        m.requests.labels(ctx.endpoint, tier, str(status)).inc()
        m.latency.labels(ctx.endpoint, tier, "true" if stream else "false").observe(now - ctx.t0)
        m.overhead.labels(ctx.endpoint, "true" if stream else "false").observe(
            ctx.overhead_ms(now) / 1000.0
        )
        if ctx.first_byte_at is not None:
            m.ttft.labels(tier).observe(ctx.first_byte_at - ctx.t0)
        if ctx.prompt_tokens:
            m.tokens.labels(tier, "prompt").inc(ctx.prompt_tokens)
            if (sizes := ctx.route_counts) is not None:  # the tier's count: learn the estimate
                error = self.token_calibrator.observe(sizes, ctx.prompt_tokens)
                if error is not None:
                    m.prompt_token_error.observe(error)
            if ctx.route_tokens is not None and ctx.route_tokens[1]:  # sized from the session
                used = ctx.route_tokens[0]
                m.prompt_token_anchored_error.observe(
                    abs(used - ctx.prompt_tokens) / ctx.prompt_tokens
                )
        if ctx.completion_tokens:
            m.tokens.labels(tier, "completion").inc(ctx.completion_tokens)
        end_span(span, ctx, status, model)


def _anchor(ctx: RequestContext) -> Anchor | None:
    """The finished step as the tier counted it, for sizing the session's next step."""
    if ctx.route_position is None or ctx.route_counts is None or not ctx.prompt_tokens:
        return None
    messages, last = ctx.route_position
    return Anchor(messages, last, ctx.route_counts, ctx.prompt_tokens)


def _is_openai_error(raw: bytes) -> bool:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict)


def _wrap_error(result: Completed) -> bytes:
    err = InvalidRequest(f"upstream: {upstream_message(result.body)}", status=result.status)
    return orjson.dumps(err.body())
