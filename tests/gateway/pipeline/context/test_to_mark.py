"""A clearing that masking leaves above its low-water mark goes on to it with the
extractive summary (``condense(..., extract=...)``; ``context.summarize_to_mark``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.config import ContextSettings
from gateway.pipeline.context import masking
from gateway.pipeline.context.ladder import Knobs, condense
from gateway.pipeline.context.stage import ask
from tests.gateway.pipeline.conftest import parsed
from tests.gateway.pipeline.context.agent import session, step
from tests.gateway.pipeline.context.test_ladder import Recorder, counter, tokens
from tests.gateway.pipeline.context.test_stage import scope


class Extract(Recorder):
    async def __call__(self, span, previous):
        text, _ = await super().__call__(span, previous)
        return text, "extractive"


def agent() -> list[dict]:
    """Four long (maskable) outputs, then twenty short ones that masking leaves whole."""
    msgs = session(4, chars=4000)
    for i in range(4, 24):
        msgs += step(i, 300)
    return msgs


def masked_all(msgs: list[dict]) -> int:
    calls, old = masking.call_names(msgs), masking.maskable(msgs, 3)
    out = list(msgs)
    for i in old:
        out[i] = masking.masked(msgs[i], calls, 240)
    return tokens(out)


def knobs_short_of_the_mark(msgs: list[dict], **kw) -> Knobs:
    """A budget where masking every old output leaves the room but not the mark."""
    masked = masked_all(msgs)
    knobs = Knobs(int(masked * 1.6), clear_to=0.5, clear_at_least=512, **kw)
    assert knobs.low_water < masked <= knobs.budget - knobs.room < tokens(msgs)
    return knobs


def run(msgs, knobs, extract, memory=None, summarize=None):
    summarize = summarize or Recorder(chars=3 * knobs.summary_room)
    return asyncio.run(condense(msgs, knobs, counter(knobs.budget), summarize, memory, extract))


def test_masking_short_of_the_mark_goes_on_with_the_extractive_summary():
    msgs = agent()
    knobs = knobs_short_of_the_mark(msgs)
    model, extract = Recorder(chars=3 * knobs.summary_room), Extract(chars=3 * knobs.summary_room)
    done = run(msgs, knobs, extract, summarize=model)
    assert done is not None and done.report.fits
    assert done.report.summarizer == "extractive" and done.report.summarized > 0
    assert len(extract.calls) == 1 and not model.calls  # no model call for it
    assert done.report.tokens_after <= knobs.low_water < masked_all(msgs)
    assert done.messages[-6:] == msgs[-6:]  # the latest turns stay whole
    without = run(msgs, knobs, None)  # no extract: the masking stands, above the mark
    assert without is not None and without.report.summarized == 0
    assert without.report.masked == 4 and without.report.tokens_after > knobs.low_water


def test_where_masking_leaves_no_room_it_comes_before_the_model_summary():
    """Masking the old outputs leaves no room: the extractive summary takes the oldest
    turns, the latest outputs stay whole, and the model summarizer is not called (without
    ``extract`` the summary rung asks it)."""
    msgs = agent()
    knobs = Knobs(masked_all(msgs) + 100, clear_to=0.5, clear_at_least=512)
    assert masked_all(msgs) > knobs.budget - knobs.room
    model = Recorder(chars=3 * knobs.summary_room)
    done = run(msgs, knobs, Extract(chars=3 * knobs.summary_room), summarize=model)
    assert done is not None and done.report.summarizer == "extractive" and not model.calls
    assert done.report.tokens_after <= knobs.budget - knobs.room
    assert done.messages[-6:] == msgs[-6:]
    without = run(msgs, knobs, None, summarize=model)
    assert without is not None and without.report.summarizer == "test" and model.calls


def test_the_next_step_reuses_it_and_keeps_the_prefix():
    msgs = agent()
    knobs = knobs_short_of_the_mark(msgs)
    extract = Extract(chars=3 * knobs.summary_room)
    first = run(msgs, knobs, extract)
    later = msgs + step(24, 300)
    second = run(later, knobs, extract, memory=first.memory)
    assert second is not None and second.report.summarizer == "reused"
    assert second.messages[: len(first.messages)] == first.messages
    assert len(extract.calls) == 1


def test_without_the_summary_rung_or_when_the_mark_is_reached_masking_stands():
    msgs = agent()
    no_summary = knobs_short_of_the_mark(msgs, rungs=frozenset({"mask", "drop"}))
    extract = Extract()
    done = run(msgs, no_summary, extract)
    assert done is not None and done.report.summarized == 0 and not extract.calls
    reached = Knobs(masked_all(msgs) + 600, clear_to=1.0, clear_at_least=0)  # mark: the budget
    done = run(msgs, reached, extract)
    assert done is not None and done.report.summarized == 0 and not extract.calls


def test_summarize_to_mark_is_on_by_default_and_a_key_turns_it_off():
    cfg = ContextSettings.model_validate({"keys": {"key-1": {"summarize_to_mark": False}}})
    assert not ask(cfg, parsed(), scope()).to_mark
    other = parsed()
    other = replace(other, identity=replace(other.identity, api_key="other"))
    assert ask(cfg, other, scope()).to_mark
    off = ContextSettings.model_validate({"summarize_to_mark": False})
    assert not ask(off, other, scope()).to_mark
