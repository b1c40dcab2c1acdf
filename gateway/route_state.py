"""What routing remembers between steps: per-session history and the tiers' load.

Sessions are keyed by tenant and the client's ``X-Session-Id`` (or ``user``); without
either, by a hash of the session's opening (system prompt and first user message), which
every step of an agent's loop resends unchanged. The table is bounded (least recently used
sessions are forgotten first) and entries expire after ``ttl_s`` without a step, so a flood
of one-off sessions costs bounded memory.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.pool import TierPool
from gateway.scrape import Scraper
from router.tokens import Anchor
from router.types import LoadSignals, SessionState, Tier

OPENING_CHARS = 4096
OPENING_PARTS = 16


def _text(content: object) -> str:
    if isinstance(content, str):
        return content[:OPENING_CHARS]
    if isinstance(content, list):
        parts = (p.get("text") for p in content[:OPENING_PARTS] if isinstance(p, Mapping))
        return " ".join(t[:OPENING_CHARS] for t in parts if isinstance(t, str))[:OPENING_CHARS]
    return ""


def opening_key(body: Mapping[str, Any]) -> str | None:
    """A session key from the system prompt and the first user message (chat only)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    system = user = None
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if system is None and role in ("system", "developer"):
            system = _text(message.get("content"))
        elif role == "user":
            user = _text(message.get("content"))
            break
    if user is None:
        return None
    digest = hashlib.blake2b(f"{system}\x00{user}".encode(), digest_size=12).hexdigest()
    return f"opening:{digest}"


class RouteSessions:
    def __init__(self, max_sessions: int = 100_000, ttl_s: float = 3600.0) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._table: OrderedDict[tuple[str, str], tuple[float, SessionState]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def get(self, tenant: str, key: str | None) -> SessionState | None:
        if key is None:
            return None
        entry = self._table.get((tenant, key))
        if entry is None:
            return None
        seen, state = entry
        if time.monotonic() - seen > self.ttl_s:
            del self._table[(tenant, key)]
            return None
        return state

    def update(
        self,
        tenant: str,
        key: str | None,
        tier: Tier,
        *,
        escalated: bool,
        failed: bool,
        anchor: Anchor | None = None,
    ) -> None:
        """Count a finished step: the tier that answered, whether the fast tier failed and,
        when the tier counted the prompt of a routed step, that count (``anchor``)."""
        if key is None:
            return
        state = self.get(tenant, key) or SessionState()
        fast_failed = escalated or (failed and tier is Tier.FAST)
        state = replace(
            state,
            steps=state.steps + 1,
            last_tier=tier,
            escalations=state.escalations + int(escalated),
            fast_failures=state.fast_failures + int(fast_failed),
            last_failure_step=state.steps if fast_failed else state.last_failure_step,
            anchor=anchor or state.anchor,
        )
        self._table[(tenant, key)] = (time.monotonic(), state)
        self._table.move_to_end((tenant, key))
        while len(self._table) > self.max_sessions:
            self._table.popitem(last=False)


def load_signals(pools: Mapping[Tier, TierPool], scraper: Scraper) -> LoadSignals:
    """Requests queued or running per replica (the engines' own gauges, or the gateway's
    in-flight count when it is higher or no scrape has come in) and the acceptance rates."""
    queue: dict[Tier, float] = {}
    acceptance: dict[Tier, float | None] = {}
    for tier, pool in pools.items():
        stats = scraper.tiers.get(tier)
        engine = stats.total("running") + stats.total("waiting") if stats else 0.0
        in_flight = float(sum(r.in_flight for r in pool.replicas))
        queue[tier] = max(engine, in_flight) / max(1, len(pool.replicas))
        acceptance[tier] = stats.acceptance_rate if stats else None
    return LoadSignals(queue, acceptance)
