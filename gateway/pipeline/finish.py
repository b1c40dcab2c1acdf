"""The finish stage: one outcome, handed once, to everything that learns from a request.

In this order: routing's session state (so the session's next step sees this one),
metrics, token calibration (the tier's exact prompt count teaches the router's
estimate), the span, and the recorder (offered last; it never holds the request up
beyond its queue policy).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span

from gateway.access.admission import Ticket
from gateway.metrics import Metrics
from gateway.pipeline.outcome import CLIENT_CLOSED, Outcome
from gateway.pipeline.record import step_record
from gateway.pipeline.span import end_span
from gateway.recording.recorder import Recorder
from gateway.recording.records import ChainHashes
from gateway.routing.calibration import TokenCalibrator
from gateway.routing.sessions import CHAIN, RouteSessions, chain_links
from router.tokens import Anchor


class Finish:
    def __init__(
        self,
        metrics: Metrics,
        sessions: RouteSessions,
        calibrator: TokenCalibrator,
        recorder: Recorder | None,
    ) -> None:
        self.metrics = metrics
        self.sessions = sessions
        self.calibrator = calibrator
        self.recorder = recorder

    async def __call__(self, outcome: Outcome, span: Span, ticket: Ticket | None = None) -> None:
        if ticket is not None:
            ticket.settle(charged(outcome))
        hashes = chain_hashes(outcome)
        self._session(outcome, hashes)
        self._metrics(outcome)
        self._calibration(outcome)
        end_span(span, outcome)
        if self.recorder is not None and outcome.step is not None:
            await self.recorder.record(step_record(outcome, outcome.step, hashes))

    def _session(self, outcome: Outcome, hashes: ChainHashes | None) -> None:
        if outcome.status == CLIENT_CLOSED:
            return
        links = hashes.continuations if hashes is not None and outcome.answers else ()
        keys, sizing = outcome.routing.keys, outcome.routing.sizing
        self.sessions.finish(
            outcome.identity.tenant, keys, outcome.tier,
            escalated=outcome.served.escalated is not None, failed=outcome.failed,
            anchor=anchor(outcome),
            continuations=[CHAIN + c for c in links if c is not None]
            if outcome.status == 200 else (),
            answers=answers(outcome) if outcome.status == 200 and keys.named else (),
            tally=sizing.tally if sizing is not None else None,
        )  # fmt: skip

    def _metrics(self, outcome: Outcome) -> None:
        m, who = self.metrics, outcome.identity
        tier, stream = str(outcome.tier), "true" if outcome.request.stream else "false"
        m.requests.labels(who.endpoint, tier, str(outcome.status)).inc()
        m.latency.labels(who.endpoint, tier, stream).observe(outcome.ended_at - who.t0)
        m.overhead.labels(who.endpoint, stream).observe(outcome.overhead_ms() / 1000.0)
        if outcome.first_byte_at is not None:
            m.ttft.labels(tier).observe(outcome.first_byte_at - who.t0)
        if outcome.prompt_tokens:
            m.tokens.labels(tier, "prompt").inc(outcome.prompt_tokens)
        if outcome.completion_tokens:
            m.tokens.labels(tier, "completion").inc(outcome.completion_tokens)
        if outcome.stream_error is not None:
            m.stream_errors.labels(tier, outcome.stream_error).inc()
        if outcome.client_gone:
            m.client_disconnects.labels(tier).inc()

    def _calibration(self, outcome: Outcome) -> None:
        """The tier counted the prompt exactly: learn the estimate, measure its error."""
        sizing, counted = outcome.routing.sizing, outcome.prompt_tokens
        if sizing is None or not counted:
            return
        error = self.calibrator.observe(sizing.counts, counted)
        if error is not None:
            self.metrics.prompt_token_error.observe(error)
        if sizing.anchored:  # sized from the session's last exact count
            self.metrics.prompt_token_anchored_error.observe(
                abs(sizing.estimate - counted) / counted
            )


def charged(outcome: Outcome) -> int | None:
    """Tokens to charge a budget: the usage the tier reported; None (the whole reservation)
    when it reported none after tokens were produced (a cut stream); 0 when none were."""
    if outcome.prompt_tokens is not None or outcome.completion_tokens is not None:
        return (outcome.prompt_tokens or 0) + (outcome.completion_tokens or 0)
    return None if outcome.first_byte_at is not None else 0


def chain_hashes(outcome: Outcome) -> ChainHashes | None:
    """An unnamed chat session's hash chain, computed once for routing's session state and
    the recorder: the history's prefix and each answer's continuation (the recorded
    choices', else the answers kept for the chain)."""
    history = outcome.routing.keys.history
    if history is None:
        return None
    links = chain_links(history, answers(outcome))
    return None if links is None else ChainHashes(history.prefix(), links)


def answers(outcome: Outcome) -> list[Any]:
    """The step's answers: the recorded choices', else the answers kept for the chain."""
    captured = outcome.captured
    return [c.message for c in captured.choices] if captured else list(outcome.answers or ())


def anchor(outcome: Outcome) -> Anchor | None:
    """The finished step as the tier counted it, for sizing the session's next step."""
    sizing = outcome.routing.sizing
    if sizing is None or sizing.position is None or not outcome.prompt_tokens:
        return None
    messages, last = sizing.position
    return Anchor(messages, last, sizing.counts, outcome.prompt_tokens)
