"""Per-session routing history: keyed by tenant, bounded, expiring; sessions known by their
opening when the client names none."""

from __future__ import annotations

import time
from typing import Any

from gateway.routing.sessions import RouteSessions, SessionKeys, continuation_keys, opening_key
from gateway.store.chain import History
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


OPENING = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix the bug"}]


def _answer(text: str) -> dict[str, object]:
    return {"role": "assistant", "content": text, "refusal": None}  # as the engine sends it


def test_unnamed_sessions_follow_the_hash_chain_of_their_answers():
    """Two rollouts of one task share their opening; each continues its own answer, so a
    fast-tier failure in one does not send the other to full."""
    table = RouteSessions()
    first = table.keys("t", None, {"messages": OPENING})
    assert first == SessionKeys(opening_key({"messages": OPENING}), first.opening)
    assert not first.chained and not first.named and first.history is not None
    # two samples of the first step (n=2): two chains from one request
    links = continuation_keys(first.history, [_answer("plan A"), _answer("plan B")])
    assert len(set(links)) == 2 and all(k.startswith("chain:") for k in links)
    table.finish("t", first, Tier.FAST, escalated=False, failed=False, continuations=links)

    def step(answer: str, *more: dict[str, object]) -> list[dict[str, object]]:
        # the client resends the answer re-serialized: fields dropped, the rest kept
        return [*OPENING, {"role": "assistant", "content": answer}, *more]

    a = table.keys("t", None, {"messages": step("plan A", {"role": "user", "content": "go"})})
    b = table.keys("t", None, {"messages": step("plan B", {"role": "user", "content": "go"})})
    assert a.chained and b.chained and a.key != b.key and a.opening == b.opening == first.key
    state = table.get("t", a.key)
    assert state is not None and (state.steps, state.last_tier) == (1, Tier.FAST)
    a_next = continuation_keys(a.history, [_answer("x")])
    table.finish("t", a, Tier.FULL, escalated=True, failed=False, continuations=a_next)
    after_a = table.keys(
        "t", None, {"messages": [*step("plan A", {"role": "user", "content": "go"}),
                                 {"role": "assistant", "content": "x"}]}
    )  # fmt: skip
    state = table.get("t", after_a.key)
    assert state is not None and (state.steps, state.fast_failures, state.escalations) == (2, 1, 1)
    state = table.get("t", b.key)  # the other rollout: untouched
    assert state is not None and state.fast_failures == 0
    # the opening counts every unnamed step that shares it: the fallback for the unknown
    state = table.get("t", first.key)
    assert state is not None and (state.steps, state.fast_failures) == (2, 1)
    unknown = table.keys("t", None, {"messages": step("a summary of the work so far")})
    assert unknown.key == first.key and not unknown.chained
    # each chained step continued its previous step's open hash (the same keys as hashing
    # the whole history: a, b and after_a found theirs; the summary's history is new)
    assert (table.chains.hits, table.chains.misses) == (3, 1)
    whole = History(step("plan A", {"role": "user", "content": "go"})).prefix()
    assert a.key == "chain:" + str(whole)


def test_named_sessions_do_not_chain():
    table = RouteSessions()
    keys = table.keys("t", "ep-1", {"messages": OPENING})
    assert keys == SessionKeys("ep-1", named=True)
    table.finish("t", keys, Tier.FAST, escalated=False, failed=False, continuations=["chain:x"])
    assert table.get("t", "chain:x") is None and len(table) == 1


def test_unchainable_content_falls_back_to_the_opening():
    table = RouteSessions()
    odd = [*OPENING, {"role": "assistant", "content": "ok", "tool_calls": [{"function": {
        "name": "f", "arguments": {"n": 2**70}}}]}]  # fmt: skip
    keys = table.keys("t", None, {"messages": odd})
    assert keys.key == opening_key({"messages": OPENING}) and keys.history is None
    assert continuation_keys(keys.history, [_answer("x")]) == []
    assert table.keys("t", None, {"messages": "junk"}).history is None
    history = History(OPENING)
    assert continuation_keys(history, [odd[-1]]) == [] and continuation_keys(history, [None]) == []


def test_a_named_entry_is_stale_once_another_replica_answered_since() -> None:
    table = RouteSessions()
    table.recall = object()  # type: ignore[assignment]  # a store: answers are kept to check
    mine: dict[str, Any] = {"role": "assistant", "content": "a", "tool_calls": [{"id": "call-1"}]}
    theirs = {"role": "assistant", "content": "a", "tool_calls": [{"id": "call-2"}]}
    first = {"messages": [{"role": "user", "content": "go"}]}
    keys = table.keys("t", "s", first)
    assert not table.stale("t", keys, first)  # a first step continues no answer
    table.finish("t", keys, Tier.FAST, escalated=False, failed=False, answers=[mine])
    echoed = {**mine, "refusal": None, "tool_calls": [{**mine["tool_calls"][0], "type": "x"}]}
    for last, stale in ((echoed, False), (theirs, True)):
        body = {"messages": [*first["messages"], last, {"role": "tool", "content": "ok"}]}
        assert table.stale("t", table.keys("t", "s", body), body) is stale
    assert table.stale("t", table.keys("t", "new", body), body)  # unknown here: read it
    # a step that failed without an answer leaves the last answer to check against
    table.finish("t", table.keys("t", "s", body), Tier.FAST, escalated=False, failed=True)
    assert table.stale("t", table.keys("t", "s", body), body)


def test_an_unnamed_step_is_stale_only_when_no_chain_entry_knows_its_answer() -> None:
    table = RouteSessions()
    first = {"messages": [{"role": "user", "content": "go"}]}
    keys = table.keys("t", None, first)
    assert not table.stale("t", keys, first)
    answer = {"role": "assistant", "content": "done"}
    table.finish("t", keys, Tier.FULL, escalated=False, failed=False,
                 continuations=continuation_keys(keys.history, [answer]))  # fmt: skip
    body = {"messages": [*first["messages"], answer, {"role": "user", "content": "more"}]}
    assert not table.stale("t", table.keys("t", None, body), body)  # a chain key: never stale
    other = {"messages": [*first["messages"], {**answer, "content": "elsewhere"}]}
    assert table.stale("t", table.keys("t", None, other), other)
