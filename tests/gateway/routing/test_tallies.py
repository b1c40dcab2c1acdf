"""The router's tally of each session's last step: bounded, per tenant, kept where the
session's next step looks it up (named sessions by id, unnamed ones by chain key)."""

from __future__ import annotations

from typing import Any

from gateway.routing.sessions import RouteSessions, continuation_keys
from gateway.routing.tallies import Tallies
from router.analysis import PER_MESSAGE, Tally
from router.types import Tier

OPENING = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix the bug"}]


def tally(chars: int, tag: str = "") -> Tally:
    return Tally.of([{"role": "user", "content": tag + "x" * (chars - len(tag))}])


def test_the_least_recently_used_go_first_past_the_entries_or_the_bytes():
    by_count = Tallies(max_entries=2)
    for key in ("a", "b", "c"):
        by_count.put("t", key, tally(10, key))
    assert by_count.get("t", "a") is None and len(by_count) == 2
    assert by_count.get("t", "b") is not None  # now the most recently used
    by_count.put("t", "d", tally(10))
    assert by_count.get("t", "c") is None and by_count.get("t", "b") is not None
    one = tally(1000)
    assert one.size == 1000 + PER_MESSAGE
    by_bytes = Tallies(max_mb=2.5 * one.size / 2**20)
    for key in ("a", "b", "c"):
        by_bytes.put("t", key, tally(1000))
    assert len(by_bytes) == 2 and by_bytes.size_bytes == 2 * one.size
    by_bytes.put("t", "b", tally(10))  # replacing an entry gives its bytes back
    assert by_bytes.size_bytes == one.size + tally(10).size
    by_bytes.put("t", "huge", tally(10_000))  # bigger than the whole budget: not kept
    assert by_bytes.get("t", "huge") is None and len(by_bytes) == 2
    off = Tallies(max_entries=0)
    off.put("t", "a", tally(10))
    assert len(off) == 0 and off.size_bytes == 0


def test_a_tenant_never_reads_another_tenants_tally():
    tallies = Tallies()
    mine = tally(10)
    tallies.put("acme", "s-1", mine)
    assert tallies.get("acme", "s-1") is mine
    assert tallies.get("globex", "s-1") is None and tallies.get("acme", None) is None


def test_a_finished_step_leaves_its_tally_where_the_next_step_looks():
    table = RouteSessions()
    step: Any = Tally.of(OPENING)
    named = table.keys("t", "agent-1", {"messages": OPENING})
    table.finish("t", named, Tier.FAST, escalated=False, failed=False, tally=step)
    assert table.tallies.get("t", "agent-1") is step
    unnamed = table.keys("t", None, {"messages": OPENING})
    links = continuation_keys(unnamed.history, [{"role": "assistant", "content": "plan"}])
    table.finish(
        "t", unnamed, Tier.FAST, escalated=False, failed=False, continuations=links, tally=step
    )
    assert [table.tallies.get("t", k) for k in links] == [step]
    assert table.tallies.get("t", unnamed.opening) is None  # shared by every such session
    after = [*OPENING, {"role": "assistant", "content": "plan"}, {"role": "user", "content": "go"}]
    nxt = table.keys("t", None, {"messages": after})
    assert nxt.chained and table.tallies.get("t", nxt.key) is step
