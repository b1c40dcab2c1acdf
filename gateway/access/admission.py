"""Admission: may this request run, within its key's scope and every limit set for its key
and tenant? Decided before routing, for each model step (a Responses loop's too).

A request with limits reserves, from this replica's leased blocks when they cover it and
otherwise in one ledger transaction (``gateway.access.ledger``, ``gateway.access.shares``):
one request per requests-per-minute counter, and its token estimate (prompt bytes / 4,
plus ``max_tokens`` or ``limits.reserve_max_tokens``, times ``n``) on each tokens per
minute, day and month counter. Refused: 429 with ``Retry-After`` for a per-minute limit,
403 ``budget_exceeded`` (with ``Retry-After`` to the budget's next period) for a day or
month budget. Admitted, it gets a ``Ticket`` that is settled with the real usage when the
request ends, or released when it fails before producing anything. Nothing configured:
no ledger, no ticket, one dict lookup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.access import windows
from gateway.access.ledger import Ledger, Taken
from gateway.auth import Authenticator
from gateway.errors import BudgetExceeded, PermissionDenied, RateLimited
from gateway.metrics import Metrics
from gateway.store.ledger import Counter

WARNING_HEADER = "x-gearshift-budget-warning"


@dataclass(frozen=True, slots=True)
class Limits:
    """One row of the limits table: a tenant's (``key_name`` '') or a key name's."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    soft_percent: int = 80


class Ticket:
    """What an admitted request holds; settled or released exactly once."""

    __slots__ = ("_done", "_ledger", "headers", "items")

    def __init__(self, ledger: Ledger, items: Taken, headers: dict[str, str]) -> None:
        self._ledger, self.items, self.headers = ledger, items, headers
        self._done = False

    def settle(self, used: int | None) -> None:
        """Charge ``used`` tokens (None: unknown, charge the whole reservation). A request
        counts against requests-per-minute however it ended."""
        if self._done:
            return
        self._done = True
        self._ledger.settle(
            [(c, n, n if c.unit == "requests" or used is None else used) for c, n in self.items]
        )

    def release(self) -> None:
        """The request failed before any token was produced: charge no tokens."""
        self.settle(0)


class Admission:
    def __init__(self, auth: Authenticator, metrics: Metrics, reserve_max_tokens: int) -> None:
        self.auth = auth
        self.metrics = metrics
        self.reserve_max_tokens = reserve_max_tokens
        self.ledger: Ledger | None = None  # set when the store is on
        self.limits: Mapping[tuple[str, str], Limits] = {}  # replaced by the sync
        # a key's (and its tenant's) counters in the current windows, built once per second
        self._plans: dict[tuple[str, str, int], _Plan] = {}

    async def admit(
        self, tenant: str, key_name: str, body: Mapping[str, Any], raw: bytes
    ) -> Ticket | None:
        """``raw``: the body as the client sent it (empty for a body built in the gateway,
        a Responses loop's step: then it is serialized to be measured, only when limited)."""
        model = body.get("model")
        principal = self.auth.named(tenant, key_name)
        if principal is not None and isinstance(model, str) and not principal.may_use_model(model):
            allowed = ", ".join(sorted(principal.models or ()))
            raise PermissionDenied(
                f"this API key may not use model {model!r}; it may use: {allowed}", param="model"
            )
        if not self.limits:
            return None
        own, shared = self.limits.get((tenant, key_name)), self.limits.get((tenant, ""))
        if (own is None and shared is None) or self.ledger is None:
            return None
        now = time.time()
        plan = self._plan(tenant, key_name, own, shared, now)
        if not plan.counters:
            return None
        size = len(raw) or len(orjson.dumps(body))
        tokens = estimate(body, size, self.reserve_max_tokens)
        items: Taken = [(c, 1 if per_request else tokens) for c, per_request in plan.counters]
        result = await self.ledger.reserve(items)
        if isinstance(result, Counter):
            raise self._refused(result, tokens, now)
        return Ticket(self.ledger, items, self._warnings(tenant, plan, items, result))

    def _plan(
        self, tenant: str, key_name: str, own: Limits | None, shared: Limits | None, now: float
    ) -> _Plan:
        """The key's and its tenant's counters in the current windows, built once a second
        (and again when the sync replaces their limits)."""
        second = int(now)
        cached = self._plans.get((tenant, key_name, second))
        if cached is not None and cached.own is own and cached.shared is shared:
            return cached
        if len(self._plans) > 10_000:  # past seconds' entries
            self._plans.clear()
        counters = [
            (c, c.unit == "requests")
            for name, limits in ((key_name, own), ("", shared))
            if limits is not None
            for c in _counters(tenant, name, limits, now)
        ]
        soft_least = min(lim.soft_percent for lim in (own, shared) if lim is not None)
        watched = tuple(  # budgets (not per-minute limits): their soft thresholds warn
            (i, soft_least * c.cap)
            for i, (c, _) in enumerate(counters)
            if windows.period_of(c.window) != "minute"
        )
        built = self._plans[(tenant, key_name, second)] = _Plan(own, shared, counters, watched)
        return built

    def _refused(self, counter: Counter, tokens: int, now: float) -> Exception:
        period = windows.period_of(counter.window)
        scope = f"key {counter.key_name!r}" if counter.key_name else f"tenant {counter.tenant!r}"
        wait = windows.seconds_left(counter.window, now)
        self.metrics.admission_refused.labels(
            counter.tenant, "key" if counter.key_name else "tenant", f"{counter.unit}/{period}"
        ).inc()
        headers = {"retry-after": str(wait)}
        if period == "minute":
            what = (
                "requests" if counter.unit == "requests" else f"tokens (this one reserves {tokens})"
            )
            return RateLimited(
                f"{scope} is over its limit of {counter.cap} {what} per minute; retry in {wait} s",
                headers=headers,
            )
        return BudgetExceeded(
            f"{scope} has spent its token budget for this {period} ({counter.cap} tokens; this "
            f"request reserves {tokens}); it renews in {wait} s",
            headers=headers,
        )

    def _warnings(
        self, tenant: str, plan: _Plan, items: Taken, totals: list[int]
    ) -> dict[str, str]:
        """Budgets past their soft threshold: a header for the client, a metric to alert on."""
        notes = []
        for i, threshold in plan.watched:
            total = totals[i]
            if 100 * total < threshold:  # below either soft threshold
                continue
            counter = items[i][0]
            limits = self.limits.get((tenant, counter.key_name))
            soft = limits.soft_percent if limits is not None else 100
            percent = 100 * total / counter.cap if counter.cap else 100.0
            if percent >= soft:
                scope = "key" if counter.key_name else "tenant"
                period = windows.period_of(counter.window)
                self.metrics.budget_soft.labels(tenant, scope, period).inc()
                notes.append(f"{scope} {period} {math.floor(percent)}%")
        return {WARNING_HEADER: ", ".join(notes)} if notes else {}


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a key's request reserves, for one second: each counter (and whether it counts
    requests, else tokens), and the budgets' soft thresholds (index, soft percent x cap)."""

    own: Limits | None
    shared: Limits | None
    counters: list[tuple[Counter, bool]]
    watched: tuple[tuple[int, int], ...]


def _counters(tenant: str, name: str, limits: Limits, now: float) -> list[Counter]:
    minute = windows.window("minute", now)
    out: list[Counter] = []
    if limits.requests_per_minute is not None:
        out.append(Counter(tenant, name, minute, "requests", limits.requests_per_minute))
    for cap, period in (
        (limits.tokens_per_minute, "minute"),
        (limits.tokens_per_day, "day"),
        (limits.tokens_per_month, "month"),
    ):
        if cap is not None:
            out.append(Counter(tenant, name, windows.window(period, now), "tokens", cap))  # type: ignore[arg-type]
    return out


def estimate(body: Mapping[str, Any], body_bytes: int, reserve_max_tokens: int) -> int:
    """A ceiling on what the request may use: its prompt at a token per 4 bytes of JSON
    (generous for text: the JSON's quoting and keys count too), plus what it may generate."""
    most = body.get("max_completion_tokens") or body.get("max_tokens")
    completion = most if isinstance(most, int) and most > 0 else reserve_max_tokens
    n = body.get("n")
    choices = n if isinstance(n, int) and n > 0 else 1
    return math.ceil(body_bytes / 4) + completion * choices
