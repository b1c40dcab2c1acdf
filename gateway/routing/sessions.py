"""What routing remembers between steps: per-session history and the tiers' load.

Sessions are keyed by tenant and the client's ``X-Session-Id`` (or ``user``). Without
either, by hash chain, as the recorder links steps (``gateway.store.chain``): a step
whose messages up to the last assistant message hash to an earlier step's messages plus
the answer it got continues that step, and starts from the history as it stood after it.
Every sample of a prompt continues on its own chain, so agents that share an opening (RL
rollouts of one task, many users of one system prompt) do not share a routing history.
A step that continues no known answer — a session's first, or one whose history the client
compacted or edited — falls back to the hash of the session's opening (system prompt and
first user message), where every unnamed session with that opening adds its steps.

The table is bounded (least recently used entries are forgotten first) and entries expire
after ``ttl_s`` without a step, so a flood of one-off sessions costs bounded memory.

With a store, the table is a cache of the recorded steps (``gateway.routing.recall``): a
step that continues an answer this replica does not know — another replica gave it, or
this one forgot it — has its session's history rebuilt from the store first. A chain key
names one point of a conversation, so a chain entry is never stale; a named session's
entry is, when the request's last assistant message is not the answer this replica gave
last (``echo``): another replica took a step since.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.routing.tallies import Tallies
from gateway.store.chain import ChainCache, History
from gateway.upstream.pool import TierPool
from gateway.upstream.scrape import Scraper
from router.analysis import Tally
from router.tokens import Anchor
from router.types import LoadSignals, SessionState, Tier

if TYPE_CHECKING:
    from gateway.routing.recall import SessionRecall

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


CHAIN = "chain:"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """How a step's session is known: ``key`` is what routing reads (a named session, a
    chain link or the opening); ``opening`` is also kept up to date for unnamed sessions,
    as the fallback for steps that continue no known answer."""

    key: str | None
    opening: str | None = None
    named: bool = False
    # an unnamed chat step's messages, reduced once for the chain (its answers' links)
    history: History | None = field(default=None, compare=False)

    @property
    def chained(self) -> bool:
        return self.key is not None and self.key.startswith(CHAIN)


def continuation_keys(history: History | None, answers: Sequence[Any]) -> list[str]:
    """The chain keys the next steps of an unnamed chat session will look up: one per
    answer to ``history`` (a request with ``n`` samples forks ``n`` ways)."""
    links = chain_links(history, answers)
    return [CHAIN + c for c in links or () if c is not None]


def chain_links(history: History | None, answers: Sequence[Any]) -> list[str | None] | None:
    """Each answer's continuation hash (None for one that is not a message); None when
    there is no history or its content cannot be hashed."""
    if history is None:
        return None
    try:
        return [history.continuation(a) if isinstance(a, dict) else None for a in answers]
    except (TypeError, ValueError):  # content orjson cannot serialize: no chain
        return None


def last_answer(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The request's last assistant message (the answer its step continues), or None."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == "assistant":
                return message
    return None


def answer_tag(message: Mapping[str, Any]) -> int:
    """An answer as the client echoes it back: its text and its tool calls' ids (SDKs
    re-serialize the rest, ``store.chain``). Compared within one process only."""
    content = message.get("content")
    if not isinstance(content, str):
        parts = content if isinstance(content, list) else ()
        content = "".join(p["text"] for p in parts if isinstance(p, Mapping) and "text" in p)
    calls = message.get("tool_calls")
    ids = tuple(c.get("id") for c in calls if isinstance(c, Mapping)) if calls else ()
    return hash((content, ids))


def answer_tags(answers: Sequence[Any]) -> frozenset[int] | None:
    """The tags of a step's answers (one per choice); None when it has none."""
    return frozenset(answer_tag(a) for a in answers if isinstance(a, Mapping)) or None


class RouteSessions:
    def __init__(
        self,
        max_sessions: int = 100_000,
        ttl_s: float = 3600.0,
        recall: SessionRecall | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.recall = recall  # rebuilds a session's history from the store on a miss
        # (seen, state, echo): echo is the tags of the last step's answers (named sessions)
        self._table: OrderedDict[
            tuple[str, str], tuple[float, SessionState, frozenset[int] | None]
        ] = OrderedDict()
        # the last step's open hash of each unnamed chat session: the next step hashes only
        # the messages it adds (the same keys; ``gateway.store.chain.ChainCache``)
        self.chains = ChainCache(max_mb=32.0)
        # the router's tally of each session's last step, under the same keys as its state
        self.tallies = Tallies()

    def __len__(self) -> int:
        return len(self._table)

    def _entry(
        self, tenant: str, key: str
    ) -> tuple[float, SessionState, frozenset[int] | None] | None:
        entry = self._table.get((tenant, key))
        if entry is not None and time.monotonic() - entry[0] > self.ttl_s:
            del self._table[(tenant, key)]
            return None
        return entry

    def get(self, tenant: str, key: str | None) -> SessionState | None:
        if key is None:
            return None
        entry = self._entry(tenant, key)
        return None if entry is None else entry[1]

    def keys(self, tenant: str, session_id: str | None, body: Mapping[str, Any]) -> SessionKeys:
        """How the step in ``body`` is known (see the module's docstring)."""
        if session_id:
            return SessionKeys(session_id, named=True)
        opening = opening_key(body)
        messages = body.get("messages")
        if not isinstance(messages, list):
            return SessionKeys(opening, opening)
        history: History | None
        try:
            reduced = History(messages, self.chains)
            history, prefix = reduced, reduced.prefix()
        except (TypeError, ValueError):  # content orjson cannot serialize: no chain
            history, prefix = None, None
        if prefix is not None and self.get(tenant, CHAIN + prefix) is not None:
            return SessionKeys(CHAIN + prefix, opening, history=history)
        return SessionKeys(opening, opening, history=history)

    async def known(
        self, tenant: str, session_id: str | None, body: Mapping[str, Any]
    ) -> SessionKeys:
        """``keys``, after rebuilding the session's history from the store where this
        replica's is missing or stale (with a store only; see the module's docstring)."""
        keys = self.keys(tenant, session_id, body)
        if self.recall is None or not self.stale(tenant, keys, body):
            return keys
        if keys.named:
            assert keys.key is not None
            last = last_answer(body)
            tag = answer_tag(last) if last is not None else None
            state = await self.recall.named(tenant, keys.key, tag)
            if state is not None:
                self.put(
                    tenant, keys.key, state, echo=frozenset({tag}) if tag is not None else None
                )
            return keys
        prefix = keys.history.prefix() if keys.history is not None else None
        assert prefix is not None
        state = await self.recall.chain(tenant, prefix)
        if state is None:
            return keys
        self.put(tenant, CHAIN + prefix, state)
        return SessionKeys(CHAIN + prefix, keys.opening, history=keys.history)

    def stale(self, tenant: str, keys: SessionKeys, body: Mapping[str, Any]) -> bool:
        """Whether the step continues an answer this replica's history does not end with:
        a named session's entry missing or behind the request, or an unnamed step whose
        history has an answer that no chain entry here knows."""
        if keys.named:
            assert keys.key is not None
            entry = self._entry(tenant, keys.key)
            if entry is None:
                return last_answer(body) is not None
            echo = entry[2]
            if echo is None:  # no answer known yet (no store, or no step answered)
                return False
            last = last_answer(body)
            return last is not None and answer_tag(last) not in echo
        if keys.chained or keys.history is None:
            return False
        return keys.history.prefix() is not None

    def update(
        self,
        tenant: str,
        key: str | None,
        tier: Tier,
        *,
        escalated: bool,
        failed: bool,
        anchor: Anchor | None = None,
        echo: frozenset[int] | None = None,
    ) -> None:
        """Count a finished step: the tier that answered, whether the fast tier failed and,
        when the tier counted the prompt of a routed step, that count (``anchor``)."""
        if key is None:
            return
        entry = self._entry(tenant, key)
        state = advance(entry[1] if entry else None, tier, escalated, failed, anchor)
        if echo is None and entry is not None:  # no answer (a failure): the last one stands
            echo = entry[2]
        self.put(tenant, key, state, echo=echo)

    def finish(
        self,
        tenant: str,
        keys: SessionKeys,
        tier: Tier,
        *,
        escalated: bool,
        failed: bool,
        anchor: Anchor | None = None,
        continuations: Sequence[str] = (),
        answers: Sequence[Any] = (),
        tally: Tally | None = None,
    ) -> None:
        """Count a finished step where its session is known: a named session's history
        (with the answers it got, to tell when another replica took a step since); for an
        unnamed one, the opening's, and the chain's — the history this step continued (or
        a new one), advanced by it, under each of its answers' continuation keys. The
        router's ``tally`` of the step's messages goes where the next step looks: under the
        named session, or under each continuation key."""
        if keys.named:
            echo = answer_tags(answers) if self.recall is not None else None
            self.update(
                tenant, keys.key, tier, escalated=escalated, failed=failed, anchor=anchor,
                echo=echo,
            )  # fmt: skip
            if tally is not None:
                self.tallies.put(tenant, keys.key, tally)
            return
        self.update(tenant, keys.opening, tier, escalated=escalated, failed=failed, anchor=anchor)
        if continuations:
            before = self.get(tenant, keys.key) if keys.chained else None
            after = advance(before, tier, escalated, failed, anchor)
            for key in continuations:
                self.put(tenant, key, after)
                if tally is not None:
                    self.tallies.put(tenant, key, tally)

    def put(
        self, tenant: str, key: str, state: SessionState, *, echo: frozenset[int] | None = None
    ) -> None:
        self._table[(tenant, key)] = (time.monotonic(), state, echo)
        self._table.move_to_end((tenant, key))
        while len(self._table) > self.max_sessions:
            self._table.popitem(last=False)


def advance(
    state: SessionState | None, tier: Tier, escalated: bool, failed: bool, anchor: Anchor | None
) -> SessionState:
    """The history after one more step."""
    state = state or SessionState()
    fast_failed = escalated or (failed and tier is Tier.FAST)
    return replace(
        state,
        steps=state.steps + 1,
        last_tier=tier,
        escalations=state.escalations + int(escalated),
        fast_failures=state.fast_failures + int(fast_failed),
        last_failure_step=state.steps if fast_failed else state.last_failure_step,
        anchor=anchor or state.anchor,
    )


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
