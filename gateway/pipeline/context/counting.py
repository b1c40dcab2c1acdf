"""Counting a condensed request's prompt tokens as its tier will.

The router's estimate (``router.tokens``, calibrated to the tier by
``gateway.routing.calibration``) costs microseconds and is off by a few percent; where
that could decide whether a request fits (within ``margin`` of the budget), the tier's own
``/tokenize`` (vLLM: chat template and tokenizer, exactly) counts it instead. A tier
without one, or one that fails, leaves the estimate in place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from gateway.pipeline.context.messages import Message
from gateway.routing.calibration import NoTokenizer
from router.tokens import TokenModel

log = logging.getLogger(__name__)

EXACT_TIMEOUT_S = 5.0  # a /tokenize slower than this leaves the estimate in place
Tokenize = Callable[[Mapping[str, Any]], Awaitable[int]]


class RequestCounter:
    """Counts one request's candidate message lists (``ladder.Counter``)."""

    def __init__(
        self,
        model: TokenModel,
        tools: Any,
        budget: int,
        margin: float,
        tokenize: Tokenize | None,
    ) -> None:
        self.model = model
        self.tools = tools if isinstance(tools, list) and tools else None
        self.budget = budget
        self.margin = margin
        self.tokenize = tokenize
        self.exact_calls = 0
        self.scale: float | None = None  # the tier's count over the estimate, this request

    def _body(self, messages: Sequence[Message]) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": list(messages)}
        if self.tools is not None:
            body["tools"] = self.tools
        return body

    def estimate(self, messages: Sequence[Message]) -> int:
        raw = self.model.estimate(self._body(messages))
        return raw if self.scale is None else round(raw * self.scale)

    async def measure(self, messages: Sequence[Message]) -> tuple[int, bool]:
        """Exact near the budget, and the first time a request is over it: that count
        also scales this request's later estimates (``scale``), so the ladder's searches
        aim with the tier's own measure of this text, not the average one. A margin of 0
        never asks the tier."""
        estimate = self.estimate(messages)
        near = abs(estimate - self.budget) <= self.margin * self.budget
        first_over = self.scale is None and estimate > self.budget
        if self.tokenize is None or not self.margin or not (near or first_over):
            return estimate, False
        self.exact_calls += 1
        try:
            async with asyncio.timeout(EXACT_TIMEOUT_S):
                exact = await self.tokenize(self._body(messages))
        except (NoTokenizer, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("context: exact count unavailable (%s); using the estimate", exc)
            self.tokenize = None  # not again for this request
            return estimate, False
        raw = self.model.estimate(self._body(messages))
        if raw > 0:
            self.scale = exact / raw
        return exact, True
