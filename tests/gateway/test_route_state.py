"""Per-session routing history: keyed by tenant, bounded, expiring; sessions known by their
opening when the client names none."""

from __future__ import annotations

import time

from gateway.route_state import RouteSessions, opening_key
from router.tokens import Anchor, Counts, fingerprint
from router.types import Tier


def test_history_counts_steps_failures_and_escalations():
    table = RouteSessions()
    table.update("t", "s", Tier.FAST, escalated=False, failed=False)
    table.update("t", "s", Tier.FULL, escalated=True, failed=False)
    table.update("t", "s", Tier.FAST, escalated=False, failed=True)
    table.update("t", "s", Tier.FULL, escalated=False, failed=True)  # full's 5xx: not fast's
    state = table.get("t", "s")
    assert state is not None
    assert (state.steps, state.last_tier, state.escalations) == (4, Tier.FULL, 1)
    assert (state.fast_failures, state.last_failure_step) == (2, 2)
    assert table.get("other-tenant", "s") is None and table.get("t", None) is None


def test_the_last_exact_count_is_kept_until_a_newer_one():
    table = RouteSessions()
    anchor = Anchor(2, fingerprint({"role": "user", "content": "hi"}), Counts(chars=2.0), 40)
    table.update("t", "s", Tier.FAST, escalated=False, failed=False, anchor=anchor)
    table.update("t", "s", Tier.FULL, escalated=False, failed=False)  # pinned: no count
    state = table.get("t", "s")
    assert state is not None and state.anchor == anchor
    newer = Anchor(4, 7, Counts(chars=9.0), 60)
    table.update("t", "s", Tier.FAST, escalated=False, failed=False, anchor=newer)
    state = table.get("t", "s")
    assert state is not None and state.anchor == newer


def test_table_is_bounded_and_expires():
    table = RouteSessions(max_sessions=3, ttl_s=0.05)
    for i in range(5):
        table.update("t", f"s{i}", Tier.FAST, escalated=False, failed=False)
    assert len(table) == 3 and table.get("t", "s0") is None and table.get("t", "s4") is not None
    time.sleep(0.06)
    assert table.get("t", "s4") is None


def test_opening_key_ignores_later_messages():
    opening = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    later = [*opening, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    key = opening_key({"messages": opening})
    assert key is not None and key == opening_key({"messages": later})
    assert key != opening_key({"messages": [{"role": "user", "content": "task"}]})
    parts = [{"role": "user", "content": [{"type": "text", "text": "t"}] * 10_000}]
    assert opening_key({"messages": parts}) is not None
    assert opening_key({"prompt": "x"}) is None and opening_key({"messages": ["junk"]}) is None
