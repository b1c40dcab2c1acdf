"""The ladder's rungs and boundaries, counted with the router's real estimate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.pipeline.context import extractive, masking
from gateway.pipeline.context.counting import RequestCounter
from gateway.pipeline.context.ladder import Knobs, Memory, condense
from gateway.pipeline.context.messages import SUMMARY_PREFIX, text_of
from router.tokens import DEFAULT
from tests.gateway.pipeline.context.agent import SYSTEM, TASK, chat, session, step


class Recorder:
    """A summarizer that writes an extractive summary and remembers what it was asked."""

    def __init__(self, text: str | None = None, chars: int = 1200) -> None:
        self.calls: list[tuple[list[dict[str, Any]], str | None]] = []
        self.text = text
        self.chars = chars

    async def __call__(self, span: list[dict[str, Any]], previous: str | None) -> tuple[str, str]:
        self.calls.append((span, previous))
        return self.text or extractive.summarize(span, previous, self.chars), "test"


def counter(budget: int, tokenize: Any = None) -> RequestCounter:
    return RequestCounter(DEFAULT, None, budget, 0.1, tokenize)


def run(messages, knobs, summarize=None, memory=None, tokenize=None):
    # as the stage's summarizer: at most ``summary_room`` tokens (about 3 characters each here)
    summarize = summarize or Recorder(chars=min(1200, 3 * knobs.summary_room))
    return asyncio.run(
        condense(messages, knobs, counter(knobs.budget, tokenize), summarize, memory)
    )


def tokens(messages) -> int:
    return counter(1).estimate(messages)


def test_a_session_exactly_at_its_budget_is_untouched_and_one_token_over_is_not():
    msgs = session(6)
    at = tokens(msgs)
    assert run(msgs, Knobs(at)) is None
    over = run(msgs, Knobs(at - 1, clear_at_least=0))
    assert over is not None and over.report.masked >= 1
    assert over.report.tokens_after <= at - 1


def test_mask_replaces_old_outputs_keeps_calls_and_the_latest_results():
    msgs = session(10)
    budget = tokens(msgs) // 2
    done = run(msgs, Knobs(budget, keep_tool_results=3, clear_at_least=0))
    assert done is not None and done.report.fits
    out = done.messages
    assert len(out) == len(msgs)  # the tool calls and their ids stay
    assert [m.get("tool_calls") for m in out] == [m.get("tool_calls") for m in msgs]
    results = [m for m in out if m["role"] == "tool"]
    assert results[-3:] == [m for m in msgs if m["role"] == "tool"][-3:]
    masked = [r for r in results if "removed by the gateway" in r["content"]]
    assert len(masked) == done.report.masked > 0
    first = masked[0]["content"]
    assert first.startswith("[run_shell output removed") and "call the tool again" in first
    assert done.report.summarized == 0 and done.report.tokens_after <= budget
    assert done.report.header().startswith(f"masked={done.report.masked}, summarized=0")


def test_mask_clears_at_least_the_configured_amount():
    msgs = session(12)
    budget = tokens(msgs) - 50  # one masked output would do
    done = run(msgs, Knobs(budget, clear_at_least=2000))
    assert done is not None
    assert done.report.tokens_before - done.report.tokens_after >= 2000
    assert done.report.masked > 1


def test_the_next_step_keeps_the_condensed_prefix_and_writes_no_summary():
    msgs = session(12)
    knobs = Knobs(tokens(msgs) - 100, clear_at_least=1500)
    first = run(msgs, knobs)
    assert first is not None
    later = msgs + step(12, 300)  # a small new result: the cleared room absorbs it
    second = run(later, knobs, memory=first.memory)
    assert second is not None and second.report.masked == first.report.masked
    assert second.messages[: len(first.messages)] == first.messages  # the prefix cache holds


def test_a_clearing_aims_at_its_low_water_mark_and_the_next_steps_fit_in_the_room():
    msgs = session(12)
    budget = tokens(msgs) - 100  # one masked output would do
    knobs = Knobs(budget, clear_at_least=0, clear_to=0.6)
    first = run(msgs, knobs)
    assert first is not None and first.report.tokens_after <= int(budget * 0.6)
    just = run(msgs, Knobs(budget, clear_at_least=0))  # clear_to=1: just under the budget
    assert just is not None and just.report.masked < first.report.masked
    later = msgs + step(12, 2000) + step(13, 2000)  # two more steps of the same size
    second = run(later, knobs, memory=first.memory)
    assert second is not None and second.report.masked == first.report.masked
    assert second.messages[: len(first.messages)] == first.messages  # no new condensation


def test_a_masked_output_keeps_its_named_values_in_the_placeholder():
    msgs = session(10)
    done = run(msgs, Knobs(tokens(msgs) // 2, clear_at_least=0))
    assert done is not None and done.report.masked > 0
    first = done.messages[3]["content"]  # the first tool output, masked
    assert "removed by the gateway" in first and "src/module_0.py, checksum 1000" in first
    bare = run(msgs, Knobs(tokens(msgs) // 2, clear_at_least=0, digest_chars=0))
    assert bare is not None and "checksum" not in bare.messages[3]["content"]


def test_masking_drops_the_digests_before_anything_is_summarized():
    """All old outputs masked with their digests still over, masked without them under: the
    request is masked, bare, and nothing is summarized."""
    msgs = session(10, chars=4000) + [m for i in range(10, 13) for m in step(i, 300)]
    calls, old = masking.call_names(msgs), masking.maskable(msgs, 3)

    def all_masked(digest_chars: int) -> int:
        out = list(msgs)
        for i in old:
            out[i] = masking.masked(msgs[i], calls, digest_chars)
        return tokens(out)

    low, high = all_masked(0), all_masked(240)
    assert len(old) == 10 and low < high
    summarizer = Recorder()
    done = run(msgs, Knobs((low + high) // 2, clear_at_least=0), summarizer)
    assert done is not None and done.report.fits, done.report
    assert (done.report.masked, done.report.summarized) == (10, 0) and not summarizer.calls
    assert "Kept lines" not in done.messages[3]["content"]
    assert done.memory.placeholders[0] == done.messages[3]["content"]  # the next step's too


def test_no_tool_output_goes_to_a_summary_that_keeps_system_and_latest_user():
    msgs = chat(12)
    summarize = Recorder()
    knobs = Knobs(tokens(msgs) // 2, keep_recent=3, clear_at_least=0)
    done = run(msgs, knobs, summarize)
    assert done is not None and done.report.fits
    assert done.report.masked == 0 and done.report.summarized > 0
    assert done.messages[0] == SYSTEM and done.messages[-1] == msgs[-1]
    assert done.messages[1]["content"].startswith(SUMMARY_PREFIX)
    ((span, previous),) = summarize.calls
    assert previous is None and SYSTEM not in span and msgs[-1] not in span
    assert "Order 4000" in done.messages[1]["content"]  # an early value survives


def test_a_summary_is_reused_then_extended_with_the_previous_one_folded_in():
    msgs = chat(12)
    summarize = Recorder()
    knobs = Knobs(tokens(msgs) // 2, keep_recent=3, clear_at_least=500)
    first = run(msgs, knobs, summarize)
    assert first is not None and len(summarize.calls) == 1
    grown = [*msgs, {"role": "assistant", "content": "short"}, {"role": "user", "content": "ok?"}]
    again = run(grown, knobs, summarize, memory=first.memory)
    assert again is not None and again.report.summarizer == "reused"
    assert len(summarize.calls) == 1  # not re-summarized on the next step
    assert again.messages[: len(first.messages) - 1] == first.messages[:-1]
    longer = grown + chat(8)[1:]
    third = run(longer, knobs, summarize, memory=again.memory)
    assert third is not None and len(summarize.calls) == 2
    assert summarize.calls[1][1] == first.memory.summary  # the previous summary folded in


def test_tool_calls_stay_with_their_results_across_the_summary_cut():
    msgs = session(14, chars=300)  # outputs too short to mask: straight to the summary
    done = run(msgs, Knobs(tokens(msgs) // 2, keep_recent=3, clear_at_least=0))
    assert done is not None and done.report.summarized > 0
    ids = {c["id"] for m in done.messages for c in m.get("tool_calls") or ()}
    answered = {m["tool_call_id"] for m in done.messages if m["role"] == "tool"}
    assert ids == answered
    assert done.messages[1] == TASK  # the latest user turn, lifted before the summary
    assert done.messages[2]["content"].startswith(SUMMARY_PREFIX)


def test_one_tool_output_larger_than_the_budget_is_clipped_to_its_head_and_tail():
    msgs = session(2, chars=500) + step(2, 60_000)
    budget = 4000
    assert tokens(msgs) > 3 * budget
    done = run(msgs, Knobs(budget, clear_at_least=0))
    assert done is not None and done.report.fits and done.report.clipped == 1
    last = done.messages[-1]["content"]
    assert (
        last.startswith("step 2: wrote src/module_2.py") and "characters cut by the gateway" in last
    )
    assert "clipped=1" in done.report.header()


def test_a_summary_that_does_not_fit_is_dropped_and_the_answer_says_so():
    msgs = chat(12)
    huge = Recorder(text="z " * 40_000)
    done = run(msgs, Knobs(tokens(msgs) // 2, keep_recent=3, clear_at_least=0), huge)
    assert done is not None and done.report.fits
    assert done.report.dropped > 0 and done.report.summarized == 0
    assert not any(SUMMARY_PREFIX in text_of(m) for m in done.messages)
    assert f"dropped={done.report.dropped}" in done.report.header()


def test_what_cannot_fit_is_sent_and_reported_over_budget():
    msgs = [SYSTEM, {"role": "user", "content": "word " * 5000}]
    done = run(msgs, Knobs(100))
    assert done is not None and not done.report.fits
    assert done.messages == msgs and "over_budget=true" in done.report.header()


def test_near_the_budget_the_tiers_exact_count_decides():
    msgs = session(8)
    estimate = tokens(msgs)
    asked: list[int] = []

    async def tokenize(body):  # the tier counts 3% more than the estimate
        asked.append(len(body["messages"]))
        return round(counter(1).estimate(body["messages"]) * 1.03)

    assert run(msgs, Knobs(estimate + 10), tokenize=tokenize) is not None  # over, exactly
    assert asked
    asked.clear()
    assert run(msgs, Knobs(estimate * 2), tokenize=tokenize) is None  # far under: estimate only
    assert not asked


@pytest.mark.parametrize("budget_share", [0.3, 0.6, 0.9])
def test_memory_of_another_conversation_is_not_applied(budget_share):
    msgs = chat(12)
    knobs = Knobs(int(tokens(msgs) * budget_share), keep_recent=3, clear_at_least=0)
    stale = Memory(masked=0, cut=5, span="0" * 64, summary="a summary of something else")
    done = run(msgs, knobs, memory=stale)
    assert done is not None
    assert not any("something else" in text_of(m) for m in done.messages)


def test_masking_remembered_for_another_conversation_with_the_same_opening_is_not_applied():
    mine = session(12)
    knobs = Knobs(tokens(mine) - 100, clear_at_least=3000)
    first = run(mine, knobs)
    assert first is not None and first.report.masked > 1
    theirs = session(12, chars=300)  # same opening, other outputs: nothing worth masking
    assert run(theirs, Knobs(tokens(theirs) * 2), memory=first.memory) is None
    other = session(12)  # the same opening, another first output
    other[3] = {**other[3], "content": "a different first output " * 40}
    done = run(other, Knobs(tokens(other) - 1, clear_at_least=0), memory=first.memory)
    assert done is not None and done.report.masked < first.report.masked


@pytest.mark.parametrize("factor", [0.8, 1.3, 1.6])
def test_a_tier_that_counts_this_text_differently_still_gets_a_request_within_budget(factor):
    """The estimate is an average over text; on repetitive or dense text a tier counts
    30-60% more (seen on the real stack). The first exact count scales the rest."""

    async def tokenize(body):
        return round(DEFAULT.estimate(body) * factor)

    for msgs, knobs in (
        (session(12, chars=1200), Knobs(1500, clear_at_least=0)),
        (chat(12), Knobs(1500, keep_recent=3, clear_at_least=0)),
    ):
        done = run(msgs, knobs, tokenize=tokenize)
        assert done is not None and done.report.fits
        assert done.report.tokens_after <= 1500
        assert done.report.tokens_before == round(tokens(msgs) * factor)


def test_drop_alone_drops_the_oldest_turns_and_says_so():
    msgs = session(10)
    budget = tokens(msgs) // 2
    summarize = Recorder()
    done = run(msgs, Knobs(budget, rungs=frozenset({"drop"})), summarize)
    assert done is not None and done.report.fits and not summarize.calls
    assert done.report.dropped > 0 and done.report.masked == done.report.summarized == 0
    out = done.messages
    assert out[0] == SYSTEM and out[1] == TASK  # the task stays, lifted over the gap
    assert out[-4:] == msgs[-4:] and len(out) < len(msgs)
    assert not any(text_of(m).startswith(SUMMARY_PREFIX) for m in out)
    # the next step keeps the same cut (the same prefix) while it fits
    longer = [*msgs, *step(10, 100)]
    again = run(longer, Knobs(budget + 200, rungs=frozenset({"drop"})), memory=done.memory)
    assert again is not None and again.messages[: len(out)] == out


def test_summarize_without_mask_leaves_tool_outputs_whole():
    msgs = session(10)
    budget = tokens(msgs) // 2
    done = run(msgs, Knobs(budget, rungs=frozenset({"summarize", "drop"})))
    assert done is not None and done.report.fits and done.report.masked == 0
    assert done.report.summarized > 0
    kept = [m for m in done.messages if m.get("role") == "tool"]
    assert all("removed by the gateway" not in text_of(m) for m in kept)


def test_a_dropped_summary_that_is_not_enough_drops_more_turns():
    msgs = session(12)
    budget = tokens(msgs) // 3
    long_summary = Recorder("x " * 4000)  # a summary longer than the room left for it
    done = run(msgs, Knobs(budget, rungs=frozenset({"summarize", "drop"})), long_summary)
    assert done is not None and done.report.fits and done.report.dropped > 0
    assert done.report.summarized == 0
