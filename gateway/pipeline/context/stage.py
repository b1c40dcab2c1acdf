"""The context stage: between routing and the upstream body, a chat request over its
budget is condensed (``ladder``) and the messages the upstream body is built from are
returned with an account of what was done.

Opt-in, because in chat completions the client owns the history: ``context.mode`` in the
config (per tenant and per API key in ``context.tenants`` / ``context.keys``), overridden
by the request's ``x-gearshift-context: auto | off``; ``x-gearshift-context-budget`` sets
the budget in tokens for one request. Off, the stage costs one header lookup.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from starlette.types import Scope

from gateway.config import Settings
from gateway.config_context import ContextOverride, ContextSettings
from gateway.errors import InvalidRequest
from gateway.pipeline.context.counting import RequestCounter
from gateway.pipeline.context.ladder import Knobs, Memory, Report, condense
from gateway.pipeline.context.messages import Message
from gateway.pipeline.context.summary import Summarizer, SummaryCall
from gateway.pipeline.request import ParsedRequest
from gateway.pipeline.route import Routing
from gateway.routing.calibration import TokenCalibrator, replica_tokenizer
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.pool import TierPool
from router import Tier

log = logging.getLogger(__name__)
MODE_HEADER = b"x-gearshift-context"
BUDGET_HEADER = b"x-gearshift-context-budget"
HEADERS = (MODE_HEADER, BUDGET_HEADER)
CHAT_PATH = "/v1/chat/completions"  # Responses steps: ``truncation`` (docs/context.md)
MODELS_TIMEOUT = aiohttp.ClientTimeout(total=3.0)
ASK_AGAIN_S = 60.0  # a replica that did not say its window is asked again after this


@dataclass(frozen=True, slots=True)
class Applied:
    """The condensed messages the upstream body is built from, and what was done."""

    messages: list[Message]
    report: Report
    summary: str | None = None  # the summary in place, when one was written for this step
    calls: tuple[SummaryCall, ...] = ()  # the model calls that wrote it (recorded as steps)

    def header(self) -> str:
        return self.report.header()

    def event(self, api: str) -> dict[str, Any]:
        """The session event the recorder writes with the step (``context_events``), and
        the summary's model calls, each a step of its own before it."""
        r = self.report
        calls = [
            {"id": os.urandom(16).hex(), "request": c.request, "answer": c.answer,
             "tier": c.tier, "replica": c.replica, "duration_ms": c.duration_ms,
             "created_at": c.created_at}
            for c in self.calls
        ]  # fmt: skip
        return {
            "api": api, "masked": r.masked, "clipped": r.clipped, "summarized": r.summarized,
            "dropped": r.dropped, "tokens_before": r.tokens_before,
            "tokens_after": r.tokens_after, "exact": r.exact, "summarizer": r.summarizer,
            "summary": self.summary, "summary_steps": calls,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ask:
    """What one request asked of the stage, from its headers and the config."""

    on: bool
    budget_tokens: int | None
    fraction: float
    summarizer: str = "fast"
    rungs: tuple[str, ...] = ("mask", "summarize", "drop")
    clear_to: float = 0.5
    digest_chars: int = 240
    to_mark: bool = True  # masking short of the mark goes on with the extractive summary


def _headers(scope: Scope) -> tuple[bytes | None, bytes | None]:
    mode = budget = None
    for name, value in scope.get("headers") or ():
        if name == MODE_HEADER:
            mode = value
        elif name == BUDGET_HEADER:
            budget = value
    return mode, budget


def ask(cfg: ContextSettings, parsed: ParsedRequest, scope: Scope) -> Ask:
    """The mode and budget for ``parsed``: header, then API key, tenant, config. A bad
    header is the client's error (400, naming it)."""
    who = parsed.identity
    layers: list[ContextOverride] = [
        o for o in (cfg.keys.get(who.api_key), cfg.tenants.get(who.tenant)) if o is not None
    ]
    mode_raw, budget_raw = _headers(scope)
    on = next((o.mode == "auto" for o in layers if o.mode is not None), cfg.mode == "auto")
    if mode_raw is not None:
        value = mode_raw.decode("latin-1").strip().lower()
        if value not in ("auto", "off"):
            raise InvalidRequest(
                f"x-gearshift-context must be 'auto' or 'off', not {value[:40]!r}",
                param="x-gearshift-context",
            )
        on = value == "auto"
    budget = next((o.budget_tokens for o in layers if o.budget_tokens), cfg.budget_tokens)
    if budget_raw is not None:
        text = budget_raw.decode("latin-1").strip()
        if not text.isdigit() or not 0 < int(text) < 10_000_000:
            raise InvalidRequest(
                f"x-gearshift-context-budget must be a positive number of tokens, not "
                f"{text[:40]!r}",
                param="x-gearshift-context-budget",
            )
        budget = int(text)
    fraction = next((o.budget_fraction for o in layers if o.budget_fraction), cfg.budget_fraction)
    summarizer = next((o.summarizer for o in layers if o.summarizer), cfg.summarizer)
    rungs = next((o.rungs for o in layers if o.rungs is not None), cfg.rungs)
    clear_to = next((o.clear_to_fraction for o in layers if o.clear_to_fraction), None)
    digest = next((o.mask_digest_chars for o in layers if o.mask_digest_chars is not None), None)
    to_mark = next(
        (o.summarize_to_mark for o in layers if o.summarize_to_mark is not None),
        cfg.summarize_to_mark,
    )
    return Ask(
        on, budget, fraction, summarizer, tuple(rungs), clear_to or cfg.clear_to_fraction,
        cfg.mask_digest_chars if digest is None else digest, to_mark,
    )  # fmt: skip


class ContextStage:
    def __init__(
        self,
        settings: Settings,
        pools: Mapping[Tier, TierPool],
        calibrator: TokenCalibrator,
        dispatcher: Callable[[], Dispatcher | None],
        session: Callable[[], aiohttp.ClientSession | None],
    ) -> None:
        self.cfg = settings.context
        self.capture = settings.store.enabled  # summary steps are recorded with token ids
        self.default_window = settings.embedded.max_model_len
        self.pools = pools
        self.calibrator = calibrator
        self.dispatcher = dispatcher
        self.session = session
        self.windows: dict[Tier, int] = dict(self.cfg.window_tokens)
        self._asked: dict[Tier, float] = {}  # when a replica was last asked for its window
        self.memory: collections.OrderedDict[tuple[str, str], Memory] = collections.OrderedDict()
        # nothing per request when no config can turn it on: only the header can
        self.configured = self.cfg.mode == "auto" or bool(self.cfg.tenants or self.cfg.keys)

    def wanted(self, parsed: ParsedRequest, scope: Scope) -> Ask | None:
        """What the request asks of the stage, or None when it is off for it. A Responses
        step says so itself (``truncation``): ``auto`` turns the stage on for it, with
        the budget the config, tenant and key give; anything else leaves it off."""
        if parsed.identity.endpoint != "chat":
            return None
        if scope.get("path") != CHAT_PATH:
            if parsed.identity.context != "auto":
                return None
            return replace(ask(self.cfg, parsed, scope), on=True)
        if not self.configured and not any(n in HEADERS for n, _ in scope["headers"]):
            return None
        found = ask(self.cfg, parsed, scope)
        return found if found.on else None

    async def __call__(self, parsed: ParsedRequest, routing: Routing, found: Ask) -> Routing:
        """``routing`` with the condensed messages when ``parsed`` is over its budget. A
        failure here is a bug: logged, and the request goes on as the client sent it."""
        keys = routing.keys
        try:
            applied = await self.condense(
                parsed, routing.tier, keys.key if keys.named else keys.opening, found
            )
        except Exception:  # a context bug must not fail the request
            log.exception("context management failed on request %s", parsed.identity.request_id)
            return routing
        return routing if applied is None else replace(routing, context=applied)

    async def condense(
        self, parsed: ParsedRequest, tier: Tier, session_key: str | None, found: Ask
    ) -> Applied | None:
        """The condensed messages when ``parsed`` is over its budget, else None."""
        messages = parsed.body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return None  # validated upstream of here; nothing this stage can read
        window = await self.window(tier)
        budget = found.budget_tokens or int(found.fraction * window)
        counter = RequestCounter(
            self.calibrator.model, parsed.body.get("tools"), budget, self.cfg.exact_margin,
            self._tokenizer(tier),
        )  # fmt: skip
        knobs = Knobs(
            budget, self.cfg.keep_tool_results, self.cfg.keep_recent_messages,
            self.cfg.clear_at_least_tokens, found.clear_to, self.cfg.summary_max_tokens,
            frozenset(found.rungs), found.digest_chars,
        )  # fmt: skip
        key = (parsed.identity.tenant, session_key) if session_key else None
        summarizer = self.summarizer(window, found.summarizer, knobs.summary_room)
        extract = (
            self.summarizer(window, "extractive", knobs.summary_room) if found.to_mark else None
        )
        condensed = await condense(messages, knobs, counter, summarizer, self._recall(key), extract)
        if condensed is None:
            return None
        if key is not None:
            self._remember(key, condensed.memory)
        written = condensed.report.summarizer not in (None, "reused")
        summary = condensed.memory.summary if written and not condensed.memory.dropped else None
        return Applied(condensed.messages, condensed.report, summary, tuple(summarizer.calls))

    def summarizer(
        self, window: int, kind: str | None = None, max_tokens: int | None = None
    ) -> Summarizer:
        """The summarizer of ``kind`` (the config's by default): a tier, else extractive;
        its summaries take at most ``max_tokens`` (the config's ``summary_max_tokens``)."""
        kind = kind or self.cfg.summarizer
        max_tokens = max_tokens or self.cfg.summary_max_tokens
        tier = Tier.FULL if kind == "full" else Tier.FAST
        pool = self.pools.get(tier)
        tier_window = self.windows.get(tier, window)
        room = tier_window - self.cfg.summary_max_tokens - 300  # instructions and template
        return Summarizer(
            self.dispatcher(), pool.model if pool is not None else None,
            use_fast=kind != "extractive", max_tokens=max_tokens,
            timeout_s=self.cfg.summary_timeout_s, input_tokens=max(500, room),
            tokens=self.calibrator.model, capture=self.capture, tier=tier,
        )  # fmt: skip

    def _tokenizer(self, tier: Tier) -> Any:
        session, pool = self.session(), self.pools.get(tier)
        if session is None or pool is None:
            return None
        replica = next((r for r in pool.replicas if r.eligible()), None)
        return replica_tokenizer(session, replica.url, pool.model) if replica else None

    async def window(self, tier: Tier) -> int:
        """The tier's context window: configured, else what its replica says
        (``max_model_len`` in vLLM's ``/v1/models``, asked once), else the embedded one."""
        found = self.windows.get(tier)
        if found is not None:
            return found
        now = time.monotonic()
        if now - self._asked.get(tier, -ASK_AGAIN_S) < ASK_AGAIN_S:
            return self.default_window  # asked lately, in vain: not on every request
        self._asked[tier] = now
        window = await self._ask_window(tier)
        if window is None:
            return self.default_window
        self.windows[tier] = window
        return window

    async def _ask_window(self, tier: Tier) -> int | None:
        session, pool = self.session(), self.pools.get(tier)
        if session is None or pool is None or not pool.replicas:
            return None
        url = pool.replicas[0].url + "/v1/models"
        try:
            async with session.get(url, timeout=MODELS_TIMEOUT) as resp:
                data = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("context: %s gave no context window (%s)", url, exc)
            return None
        for model in (data or {}).get("data") or () if isinstance(data, dict) else ():
            length = model.get("max_model_len") if isinstance(model, dict) else None
            if isinstance(length, int) and length > 0:
                return length
        return None

    def _recall(self, key: tuple[str, str] | None) -> Memory | None:
        if key is None:
            return None
        found = self.memory.get(key)
        if found is not None:
            self.memory.move_to_end(key)
        return found

    def _remember(self, key: tuple[str, str], memory: Memory) -> None:
        self.memory[key] = memory
        self.memory.move_to_end(key)
        while len(self.memory) > self.cfg.sessions:
            self.memory.popitem(last=False)
