"""A session growing step by step through the ladder: it clears in chunks, and between two
clearings each upstream body extends the previous one (the engine's prefix cache)."""

from __future__ import annotations

from typing import Any

from gateway.pipeline.context.ladder import Knobs, Memory
from gateway.pipeline.context.messages import SUMMARY_PREFIX
from tests.gateway.pipeline.context.agent import TASK, session
from tests.gateway.pipeline.context.test_ladder import Recorder, run, tokens

Body = list[dict[str, Any]]


def walk(
    steps: int, chars: int, knobs: Knobs, summarize: Recorder, question: bool = False
) -> list[tuple[Body, str]]:
    """Each step's upstream body and what the ladder did ("" when it sent it untouched),
    the session's memory carried from step to step as the stage does."""
    full = session(steps, chars)
    if question:
        full = [*full, {"role": "user", "content": "QUESTION: which checksum had step 0?"}]
    out: list[tuple[Body, str]] = []
    memory: Memory | None = None
    for end in [*range(4, len(full), 2), len(full)]:
        done = run(full[:end], knobs, summarize, memory)
        if done is None:
            out.append((full[:end], ""))
            continue
        memory = done.memory
        assert done.report.fits and done.report.tokens_after <= knobs.budget
        out.append((done.messages, done.report.summarizer or f"masked={done.report.masked}"))
    return out


def extends(before: Body, after: Body) -> bool:
    return after[: len(before)] == before


SHORT = 350  # characters of each tool output: too short to mask, so the ladder summarizes


def small_budget() -> int:
    """Five steps: the summary and the latest turn the ladder keeps take most of it."""
    return 5 * (tokens(session(1, SHORT)) - tokens(session(0, SHORT)))


def test_a_small_budget_summarizes_once_per_chunk_and_the_bodies_between_extend() -> None:
    summarize = Recorder(chars=3 * Knobs(small_budget()).summary_room)
    steps = walk(16, SHORT, Knobs(small_budget(), clear_to=0.5, clear_at_least=512), summarize)
    written = [i for i, (_, by) in enumerate(steps) if by == "test"]
    assert written and len(summarize.calls) == len(written)  # one summary per clearing
    assert len(written) <= len(steps) // 2  # once per chunk of growth, not once per step
    reused = [i for i, (_, by) in enumerate(steps) if by == "reused"]
    assert len(reused) >= len(written) - 1  # between two summaries, steps repeat the first
    for i in range(1, len(steps)):
        if steps[i][1] in ("", "reused"):
            assert extends(steps[i - 1][0], steps[i][0]), i  # the same prefix, grown
    for i in reused:
        body = steps[i][0]
        assert body[1] == TASK and body[2]["content"].startswith(SUMMARY_PREFIX)


def test_the_same_session_clearing_just_under_the_budget_summarizes_on_most_steps() -> None:
    """The baseline the chunking fixes: ``clear_to`` 1 leaves no room, and the recent
    messages kept fill the budget, so nearly every step past it writes a summary."""
    summarize = Recorder(chars=3 * Knobs(small_budget()).summary_room)
    steps = walk(16, SHORT, Knobs(small_budget(), clear_to=1.0, clear_at_least=512), summarize)
    condensed = [by for _, by in steps if by]
    assert len(summarize.calls) >= len(condensed) - 1


def test_masking_clears_in_chunks_and_keeps_placeholders_in_place() -> None:
    full = session(14, 2000)
    knobs = Knobs(tokens(full) // 3, clear_to=0.5, clear_at_least=512)
    steps = walk(14, 2000, knobs, Recorder())
    condensed = [i for i, (_, by) in enumerate(steps) if by]
    assert all(by.startswith("masked=") for _, by in steps if by)  # masking sufficed
    changed = [i for i in condensed[1:] if not extends(steps[i - 1][0], steps[i][0])]
    assert changed and len(changed) <= len(condensed) // 2 + 1  # chunks, not every step
    for i in condensed[1:]:
        before, after = steps[i - 1][0], steps[i][0]
        masked = [j for j, m in enumerate(before) if "removed by the gateway" in str(m["content"])]
        assert all(after[j] == before[j] for j in masked)  # a placeholder never moves
    last = steps[-1][0]
    assert last[-1] == full[-1]  # the latest output is never masked


def test_a_new_user_turn_after_a_summary_keeps_the_lifted_task_in_place() -> None:
    summarize = Recorder(chars=3 * Knobs(small_budget()).summary_room)
    knobs = Knobs(small_budget(), clear_to=0.5, clear_at_least=512)
    steps = walk(9, SHORT, knobs, summarize, question=True)
    *_, (before, by_before), (asked, by) = steps
    assert by_before and summarize.calls and asked[1] == TASK  # verbatim, where it was
    assert asked[-1]["content"].startswith("QUESTION")
    if by == "reused":  # the question fitted: the body grew by it alone
        assert extends(before, asked)
    for span, _ in summarize.calls:
        assert TASK not in span  # never summarized: it is in the prompt itself
