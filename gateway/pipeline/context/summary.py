"""Summaries on the fast tier, with the extractive summarizer as their fallback.

The fast tier is the point of having one here: a summary is a short, structured rewrite
that a smaller model writes well and cheaply. The request asks for fixed headings (task,
decisions, facts and values, files, DONE, pending) with the previous summary folded in.
When the fast tier is absent, answers with an error, an empty text, or takes longer than
``timeout_s``, the extractive summary stands in (``extractive``): a step never fails
because its summary could not be written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.pipeline.context import extractive
from gateway.pipeline.context.messages import Message, text_of
from gateway.recording.capture import prepare
from gateway.upstream.dispatch import Attempts, Completed, Dispatcher
from router import Tier
from router.tokens import DEFAULT, TokenModel

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "You condense an AI agent's working history so that it can continue without it. Write "
    "only these sections, as short bullet lists, in this order:\n"
    "Task: what the user asked for.\n"
    "Facts and values learned: exact numbers, names, ids, paths, error messages, outputs.\n"
    "Files touched: paths read or changed.\n"
    "DONE: actions already completed (tool calls made and their result).\n"
    "Decisions: choices made and why.\n"
    "Pending: what remains to be done.\n"
    "Copy values exactly. Fold the earlier summary, if given, into yours. Do not invent "
    "anything; do not address the agent."
)
MESSAGE_CHARS = 3000  # of each message, in the summarizer's input (head and tail kept)


def transcript(span: Sequence[Message], previous: str | None, max_chars: int) -> str:
    """The span as plain text for the summarizer: one block per message, long ones cut
    in the middle, the whole at most ``max_chars`` (the latest messages win)."""
    blocks = []
    for m in span:
        text = text_of(m)
        if len(text) > MESSAGE_CHARS:
            half = MESSAGE_CHARS // 2
            text = f"{text[:half]}\n[...]\n{text[-half:]}"
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                text += f"\n-> call {fn.get('name')}({str(fn.get('arguments'))[:500]})"
        blocks.append(f"[{m.get('role')}] {text}")
    room = max_chars - (len(previous) if previous else 0)
    kept: list[str] = []
    for block in reversed(blocks):
        if len(block) > room:
            break
        kept.append(block)
        room -= len(block) + 1
    head = f"Earlier summary:\n{previous}\n\n" if previous else ""
    return head + "History to condense:\n" + "\n".join(reversed(kept))


@dataclass(frozen=True, slots=True)
class SummaryCall:
    """A model call that wrote a summary, as the recorder keeps it (a step of its own)."""

    request: dict[str, Any]  # the chat body sent, capture fields included
    answer: dict[str, Any]  # the tier's chat completion
    tier: str
    replica: str | None
    duration_ms: float
    created_at: float  # unix time


class Summarizer:
    """Writes a span's summary: on the fast tier (``use_fast``), else extractively.
    ``calls`` keeps each model call that wrote one (the recorder's summary steps);
    ``tier`` is the tier asked (the fast one unless a benchmark compares)."""

    def __init__(
        self,
        dispatcher: Dispatcher | None,
        model: str | None,
        *,
        use_fast: bool,
        max_tokens: int,
        timeout_s: float,
        input_tokens: int,
        tokens: TokenModel = DEFAULT,
        capture: bool = False,
        tier: Tier = Tier.FAST,
    ) -> None:
        self.dispatcher = dispatcher
        self.model = model
        self.use_fast = use_fast and dispatcher is not None and model is not None
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.input_tokens = input_tokens  # the fast tier's window, less the answer
        self.tokens = tokens
        self.capture = capture  # ask for token ids: the summary step is recorded
        self.tier = tier
        self.calls: list[SummaryCall] = []

    async def __call__(self, span: list[Message], previous: str | None) -> tuple[str, str]:
        if self.use_fast:
            text = await self._fast(span, previous)
            if text:
                return text, str(self.tier)
        # regular expressions over the span: off the event loop, as the tiers' I/O is
        text = await asyncio.to_thread(self._extractive, span, previous)
        return text, "extractive"

    def _extractive(self, span: list[Message], previous: str | None) -> str:
        """The extractive summary within ``max_tokens`` as estimated (characters per
        token vary fourfold between prose and data)."""
        chars = self.max_tokens * 4
        for _ in range(4):
            text = extractive.summarize(span, previous, chars)
            estimate = self.tokens.estimate({"messages": [{"role": "user", "content": text}]})
            if estimate <= self.max_tokens:
                break
            chars = int(chars * self.max_tokens / estimate * 0.9)
        return text

    def _prompt(self, span: list[Message], previous: str | None) -> list[Message]:
        return _fitted(span, previous, self.tokens, self.input_tokens)

    async def _fast(self, span: list[Message], previous: str | None) -> str | None:
        assert self.dispatcher is not None
        body: dict[str, Any] = {
            "messages": self._prompt(span, previous),
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }
        if self.capture:
            prepare("chat", body)  # token ids and log-probabilities, as for any step
        attempts = Attempts(self.tier)
        started, t0 = time.time(), time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await self.dispatcher.dispatch(
                    lambda model: orjson.dumps({**body, "model": model}),
                    "/v1/chat/completions", False, attempts, allow_fallback=False,
                )  # fmt: skip
        except (GatewayError, TimeoutError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else exc.message
            log.warning("context: fast-tier summary failed (%s); extractive instead", why)
            return None
        assert isinstance(result, Completed)  # not streamed
        text, data = _answer_text(result)
        if text is not None and data is not None:
            took = (time.perf_counter() - t0) * 1000
            self.calls.append(
                SummaryCall(body, data, str(attempts.tier), attempts.replica, took, started)
            )
        return text


def _fitted(
    span: Sequence[Message], previous: str | None, tokens: TokenModel, limit: int
) -> list[Message]:
    """The summarizer's messages, the transcript cut until the estimate is within
    ``limit`` tokens (characters per token vary fourfold between prose and data)."""
    chars = limit * 4
    for _ in range(4):
        messages = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": transcript(span, previous, chars)},
        ]
        estimate = tokens.estimate({"messages": messages})
        if estimate <= limit:
            break
        chars = int(chars * limit / estimate * 0.9)
    return messages


def _answer_text(result: Completed) -> tuple[str | None, dict[str, Any] | None]:
    """The summary's text and the whole answer; (None, None) for an error or nothing."""
    if result.status != 200:
        log.warning(
            "context: fast tier answered %s to a summary; extractive instead", result.status
        )
        return None, None
    try:
        data = orjson.loads(result.body)
        text = data["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        log.warning("context: fast tier's summary answer was malformed; extractive instead")
        return None, None
    if not isinstance(text, str) or not text.strip():
        return None, None
    return text.strip(), data
