"""Tally: a session's step reads only the messages it appends to its last step's, and gets
the counts, features and decisions a reading of the whole request gives."""

from __future__ import annotations

import random
from typing import Any

import pytest

import router.tokens
from router import RouteRequest, build_policy
from router.analysis import Tally
from router.step_features import SCAN, analyse
from router.tokens import DEFAULT, DIGIT_BUDGET, NO_SUMS, Anchor, counts
from router.types import SessionState

TOOLS = [
    {"type": "function", "function": {"name": "run", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}}}},
]  # fmt: skip
WORDS = ["fix", "the", "test", "def f(x):", "return", "```", "\\frac{1}{2}", "12 + 30", "Ошибка",
         "数据", "🙂", "error", "SELECT a FROM b", "{\"k\": 1}", "\n", "prove"]  # fmt: skip


def text(rng: random.Random, longest: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, longest)))


def message(rng: random.Random, i: int) -> Any:
    """A random message of an agent's conversation, odd shapes included."""
    kind = rng.choice(["user", "assistant", "call", "tool", "tool", "error", "parts", "odd"])
    if kind == "user":
        return {"role": "user", "content": text(rng, 2000 if rng.random() < 0.1 else 40)}
    if kind == "assistant":
        return {"role": "assistant", "content": text(rng, 30)}
    if kind == "call":
        args: Any = f'{{"cmd": "ls {i}"}}' if rng.random() < 0.7 else {"cmd": ["ls", i]}
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": args}}
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    if kind == "tool":
        return {"role": "tool", "tool_call_id": f"c{i}", "content": text(rng, 600)}
    if kind == "error":
        return {"role": "tool", "tool_call_id": f"c{i}", "content": "Traceback: " + text(rng, 5)}
    if kind == "parts":
        return {"role": "user", "content": [{"type": "text", "text": text(rng, 20)}, {"x": 1}]}
    return rng.choice(["not a message", {"role": "tool", "content": None}, {"content": "?"}])


def session(rng: random.Random) -> list[tuple[list[Any], bool]]:
    """A conversation's requests, each the last one's messages plus a few more, and whether
    the client edited or dropped one of the earlier messages first (then False)."""
    first = [{"role": "system", "content": text(rng, 50)}] if rng.random() < 0.7 else []
    messages = [*first, {"role": "user", "content": text(rng, 40)}]
    steps = [(list(messages), True)]
    for i in range(rng.randint(3, 25)):
        kept = rng.random() < 0.85
        if not kept:
            at = rng.randrange(len(messages))
            messages[at : at + 1] = [message(rng, i)] if rng.random() < 0.5 else []
        messages += [message(rng, i) for _ in range(rng.randint(0, 3))]
        steps.append((list(messages), kept))
    return steps


def body(messages: list[Any], rng: random.Random) -> dict[str, Any]:
    extra = rng.choice([{}, {"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "required"}])
    return {"model": "auto", "messages": messages, "max_tokens": 64, **extra}


CHAIN = build_policy("session", {"base": "classifier"})


@pytest.mark.parametrize("seed", range(40))
def test_incremental_equals_afresh_on_random_growing_sessions(seed: int):
    rng = random.Random(seed)
    tally: Tally | None = None
    state = SessionState()
    for messages, kept in session(rng):
        b = body(messages, rng)
        grown = RouteRequest("chat", b, "s", state, prior=tally)
        afresh = RouteRequest("chat", b, "s", state)
        assert grown.analysis.counts == afresh.analysis.counts == counts(b)
        assert grown.analysis.step == afresh.analysis.step == analyse(b)
        assert grown.analysis.prompt_tokens == afresh.analysis.prompt_tokens
        one, other = CHAIN.decide(grown), CHAIN.decide(afresh)
        assert (one.tier, one.reason, one.score, dict(one.features)) == (
            other.tier, other.reason, other.score, dict(other.features),
        )  # fmt: skip
        # a step that resends the last one's messages takes the incremental path
        assert tally is None or (tally.extended(messages) is not None) == kept
        tally = grown.analysis.tally
        assert tally is not None and tally.messages == messages
        state = SessionState(steps=state.steps + 1, last_tier=one.tier)


def test_a_step_reads_only_the_messages_it_appends(monkeypatch: pytest.MonkeyPatch):
    rng = random.Random(7)
    steps = [m for m, _ in session(random.Random(3))]
    read: list[int] = []
    real = router.tokens._content

    def counting(content: object, texts: list[str]) -> int:
        read.append(1)
        return real(content, texts)

    monkeypatch.setattr(router.tokens, "_content", counting)
    first = RouteRequest("chat", body(steps[-2], rng)).analysis
    assert first.counts and len(read) == sum(isinstance(m, dict) for m in steps[-2])
    read.clear()
    b = body(steps[-1], rng)
    last = RouteRequest("chat", b, prior=first.tally).analysis
    assert last.counts and last.step
    appended = steps[-1][len(steps[-2]) :]
    assert len(read) == sum(isinstance(m, dict) for m in appended)
    assert last.counts == counts(b) and last.step == analyse(b)


def test_an_edited_or_shortened_history_is_read_afresh():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "fix the build"},
        {"role": "assistant", "content": "looking"},
        {"role": "tool", "tool_call_id": "c1", "content": "error: no such file"},
    ]
    tally = Tally.of(messages)
    edited = [*messages[:2], {"role": "assistant", "content": "looked"}, *messages[3:]]
    assert tally.extended([*edited, {"role": "user", "content": "go on"}]) is None
    assert tally.extended(messages[:3]) is None  # compacted: fewer messages
    assert tally.extended(list(messages)) is tally  # a retry of the same step
    grown = tally.extended([*messages, {"role": "user", "content": "and the tests"}])
    assert grown is not None and grown.turns.user_turns == 2 and grown.turns.tool is None
    b = {"messages": edited}
    analysis = RouteRequest("chat", b, prior=tally).analysis
    assert analysis.tally is not None and analysis.tally.messages == edited
    assert analysis.counts == counts(b) and analysis.step == analyse(b)


def test_the_tally_keeps_only_the_text_the_counts_read():
    long = "x" * (DIGIT_BUDGET // 2)
    messages = [{"role": "user", "content": long} for _ in range(6)]
    tally = Tally.of(messages)
    assert tally.sums.texts == (long, long)  # the latest DIGIT_BUDGET characters' texts
    empty = [*messages, *({"role": "user", "content": ""} for _ in range(50))]
    assert Tally.of(empty).sums.texts == (long, long)  # empty texts are not kept
    assert counts({"messages": empty}).chars == counts({"messages": messages}).chars
    huge = {"role": "user", "content": "a" * (4 * SCAN) + "tail"}
    grown = tally.extended([*messages, huge])
    assert grown is not None and grown.turns.user is not None
    assert len(grown.turns.user) == 2 * SCAN + 1 and grown.turns.user.endswith("tail")
    assert grown.size > tally.size > DIGIT_BUDGET * 3


def test_a_copy_is_kept_not_the_callers_list():
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    tally = Tally.of(messages)
    messages.append({"role": "assistant", "content": "hello"})
    assert len(tally.messages) == 1
    assert tally.extended(messages) is not None


@pytest.mark.parametrize("seed", range(20))
def test_a_step_sized_from_its_anchor_reads_its_appended_messages_once(seed: int):
    """The anchor's growth check and the appended messages' tokens come from the sums the
    tally read them into (``Tally.added``): the same sizing as counting them again."""
    rng = random.Random(seed)
    tally: Tally | None = None
    state = SessionState()
    reused = 0
    for messages, _ in session(rng):
        b = body(messages, rng)
        grown = RouteRequest("chat", b, "s", state, prior=tally)
        afresh = RouteRequest("chat", b, "s", state)
        counted = router.tokens.anchored(DEFAULT, counts(b), b, state.anchor)
        assert grown.analysis.prompt_tokens == afresh.analysis.prompt_tokens == counted
        added = grown.analysis.tally.added if grown.analysis.tally is not None else None
        reused += added is not None and counted[1]
        tally = grown.analysis.tally
        assert tally is not None
        where = grown.analysis.position
        exact = grown.analysis.prompt_tokens[0] + rng.randint(-20, 20)
        anchor = None if where is None else Anchor(*where, grown.analysis.counts, exact)
        state = SessionState(steps=state.steps + 1, anchor=anchor)
    assert reused  # some steps were sized from the appended messages' sums


@pytest.mark.parametrize("seed", range(20))
def test_sums_joined_are_the_sums_extended(seed: int):
    """``Sums.joined`` (what ``Tally.extended`` does) gives what reading on gives; the
    counts from the texts' marks (kept from join to join) are those of a reading afresh."""
    rng = random.Random(seed)
    for messages, _ in session(rng):
        cut = rng.randint(0, len(messages))
        head = NO_SUMS.extended(messages[:cut])
        joined = head.joined(NO_SUMS.extended(messages[cut:]))
        whole = NO_SUMS.extended(messages)
        assert joined == whole == head.extended(messages[cut:])
        assert (
            joined.counts(TOOLS)
            == whole.counts(TOOLS)
            == counts({"messages": messages, "tools": TOOLS})
        )
        chained, at = NO_SUMS, 0
        while at < len(messages):  # a session's steps, each appending a few messages
            step = rng.randint(1, 4)
            chained = chained.joined(NO_SUMS.extended(messages[at : at + step]))
            at += step
            if chained.marks:
                assert len(chained.marks) == len(chained.texts)
                assert chained.marks[1:] == tuple(map(router.tokens._mark, chained.texts))[1:]
        assert chained == whole and chained.counts(TOOLS) == whole.counts(TOOLS)


def test_marked_counts_equal_a_reading_of_the_latest_budget():
    """Texts longer than the budget, wide scripts, lone surrogates: each text counted on its
    own gives the counts of the joined sample."""
    rng = random.Random(5)
    pieces = ["a1;", "Ошибка 42", "数据{}", "🙂\n", "\ud800x", "x" * DIGIT_BUDGET, "7" * 3000]
    for _ in range(200):
        texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(6)]
        latest = router.tokens._latest(texts)
        marks = router.tokens._marked(latest)
        chars = sum(map(len, texts))
        assert router.tokens._classes_marked(latest, marks, chars) == router.tokens._classes(
            list(latest), chars
        )
