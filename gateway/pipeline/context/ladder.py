"""The condensation ladder, without I/O of its own: counting and summarizing are passed in.

Over its budget, a conversation goes down the ladder and stops at the first rung that fits:

1. mask the oldest tool outputs (all but the latest ``keep_tool_results``; each placeholder
   keeps a short digest of its output; without the digests when all of them masked are
   still over), then clip a recent output that alone would take half the budget; masking
   that leaves the room but not the low-water mark goes on to it with the extractive
   summary (``extract``: no model call), when one is given;
2. summarize the oldest span of turns (never the system messages, the latest user message
   or the latest ``keep_recent`` messages) into one message, the previous summary folded in;
3. drop that summarized span, and say so.

Each step starts from what the session's previous step did (``Memory``): the same tool
outputs masked and the same summary in place give the same prefix, which the engine's prefix
cache still holds. The budget triggers a clearing; a clearing aims lower, at ``clear_to`` of
the budget (and clears at least ``clear_at_least`` tokens), and is done only when it leaves
``Knobs.room`` under the budget, so that the next steps grow into that room, reusing the
condensed prefix, before the budget is crossed again (hysteresis: one clearing per room of
growth, never one per step). Where the recent messages the ladder keeps leave no such room
(a small budget), masking takes recent outputs too and a summary recent turns, down to the
latest output and the latest turn; a summary is written only when the span it covers grows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.pipeline.context import masking
from gateway.pipeline.context import messages as msgs
from gateway.pipeline.context.messages import Message

CLIP_SHARE = 0.5  # a kept tool output above this share of the budget is clipped ...
CLIP_TO = 0.25  # ... to this share
EXACT_TRIES = 3  # times masking aims lower when the tier's exact count says it missed
SUMMARY_TRIES = 2  # summaries written for one request at most (the second for a longer span)


class Counter(Protocol):
    def estimate(self, messages: Sequence[Message]) -> int:
        """Prompt tokens of a request with these messages, estimated (no I/O)."""

    async def measure(self, messages: Sequence[Message]) -> tuple[int, bool]:
        """Prompt tokens, exact when the estimate is near the budget: (tokens, exact)."""


# (the span's messages, the previous summary) -> (the summary, who wrote it)
Summarize = Callable[[list[Message], str | None], Awaitable[tuple[str, str]]]


@dataclass(frozen=True, slots=True)
class Knobs:
    budget: int  # prompt tokens a condensed request may have; over it, the ladder runs
    keep_tool_results: int = 3
    keep_recent: int = 4
    clear_at_least: int = 512
    clear_to: float = 1.0  # a rung that condenses aims at this share of the budget
    summary_tokens: int = 400  # room kept for the summary when choosing its span
    rungs: frozenset[str] = frozenset({"mask", "summarize", "drop"})  # the rungs tried
    digest_chars: int = 240  # a masked output's digest at most (0: none)

    @property
    def low_water(self) -> int:
        """What a rung that condenses aims at: room for the next steps under the budget."""
        return int(self.budget * self.clear_to)

    @property
    def room(self) -> int:
        """The growth a clearing must leave under the budget: ``clear_at_least``, at most
        the distance to the low-water mark (0 with ``clear_to`` 1: just under the budget)."""
        return min(self.clear_at_least, self.budget - self.low_water)

    @property
    def summary_room(self) -> int:
        """Tokens a summary may take: ``summary_tokens``, at most a quarter of the budget."""
        return max(32, min(self.summary_tokens, self.budget // 4))


@dataclass(frozen=True, slots=True)
class Memory:
    """What a session's previous condensation chose; repeated while it still applies."""

    masked: int = 0  # the oldest maskable tool outputs masked
    masked_span: str | None = None  # hash of the messages up to the last of them
    placeholders: tuple[str, ...] = ()  # theirs, as sent: not digested again
    cut: int = 0  # messages[head:cut] are summarized (0: no summary)
    span: str | None = None  # their hash: the summary applies only to them
    summary: str | None = None
    dropped: bool = False  # the summarized span is dropped, not summarized
    kept: tuple[int, ...] = ()  # user messages of the span left verbatim, before the summary


@dataclass(frozen=True, slots=True)
class Report:
    """What the ladder did to one request; ``header`` is ``x-gearshift-context``."""

    tokens_before: int
    tokens_after: int
    masked: int = 0  # tool outputs replaced by a placeholder
    clipped: int = 0  # recent tool outputs cut to their head and tail
    summarized: int = 0  # messages a summary stands for
    dropped: int = 0  # messages removed without a summary
    summarizer: str | None = None  # fast | extractive | reused (the previous step's)
    exact: bool = False  # tokens_after is the tier's own count
    fits: bool = True

    def header(self) -> str:
        parts = [
            f"masked={self.masked}", f"summarized={self.summarized}", f"dropped={self.dropped}",
            f"tokens_before={self.tokens_before}", f"tokens_after={self.tokens_after}",
        ]  # fmt: skip
        if self.clipped:
            parts.insert(1, f"clipped={self.clipped}")
        if self.summarizer:
            parts.append(f"summarizer={self.summarizer}")
        if not self.fits:
            parts.append("over_budget=true")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Condensed:
    messages: list[Message]
    report: Report
    memory: Memory


class _Plan:
    """The conversation under condensation: the original and what is applied to it."""

    def __init__(self, messages: Sequence[Message], knobs: Knobs, memory: Memory) -> None:
        self.original = list(messages)
        self.knobs = knobs
        self.head = msgs.head_end(messages)
        # oldest first: those masking may take (the latest output never); the first
        # ``normal`` leave the latest ``keep_tool_results``, the rest go only for room
        self.maskable = masking.maskable(messages, min(1, knobs.keep_tool_results))
        self.normal = len(masking.maskable(messages, knobs.keep_tool_results))
        self.reach = len(self.maskable) if knobs.room else self.normal
        self.calls = masking.call_names(messages)
        self.placeholders: dict[int, Message] = {}  # built once: the ladder tries many
        self.masked = 0
        if 0 < memory.masked <= len(self.maskable):
            last = self.maskable[memory.masked - 1]
            if msgs.span_key(messages[: last + 1]) == memory.masked_span:
                self.masked = memory.masked  # the same conversation: the same outputs
                for i, text in zip(self.maskable, memory.placeholders, strict=False):
                    self.placeholders[i] = {**messages[i], "content": text}
        self.clips: dict[int, Message] = {}
        self.cut, self.summary, self.dropped = 0, None, False
        self.kept: tuple[int, ...] = ()
        self.summarizer: str | None = None
        self.extract: Summarize | None = None  # the summary that takes masking to the mark
        fits = self.head < memory.cut < len(messages)
        same = fits and msgs.span_key(messages[self.head : memory.cut]) == memory.span
        if memory.span is not None and same:
            self.cut, self.summary, self.dropped = memory.cut, memory.summary, memory.dropped
            self.kept, self.summarizer = memory.kept, "reused"

    def build(self, cut: int | None = None, summary: str | None = None) -> list[Message]:
        cut = self.cut if cut is None else cut
        summary = self.summary if summary is None else summary
        base = list(self.original)
        for i in self.maskable[: self.masked]:
            base[i] = self.placeholder(i)
        for i, clip in self.clips.items():
            base[i] = clip
        if not cut:
            return base
        kept = self.lifted(cut)
        covered = len(msgs.spanned(self.original, self.head, cut, kept))
        text = None if self.dropped or summary is None else msgs.summary_message(summary, covered)
        return msgs.layout(base, self.head, cut, text, kept)

    def lifted(self, cut: int) -> tuple[int, ...]:
        return msgs.lifted(self.original, self.head, cut, self.kept)

    def placeholder(self, i: int) -> Message:
        if i not in self.placeholders:
            digest = self.knobs.digest_chars
            self.placeholders[i] = masking.masked(self.original[i], self.calls, digest)
        return self.placeholders[i]

    def bare(self) -> bool:
        """Every masked output's placeholder without its digest; False when none had one."""
        changed = False
        for i in self.maskable[: self.masked]:
            plain = masking.masked(self.original[i], self.calls, 0)
            changed = changed or plain["content"] != self.placeholder(i)["content"]
            self.placeholders[i] = plain
        return changed

    def memory(self) -> Memory:
        span = msgs.span_key(self.original[self.head : self.cut]) if self.cut else None
        masked = (
            msgs.span_key(self.original[: self.maskable[self.masked - 1] + 1])
            if self.masked
            else None
        )
        texts = tuple(self.placeholder(i)["content"] for i in self.maskable[: self.masked])
        kept = self.lifted(self.cut) if self.cut else ()
        return Memory(
            self.masked, masked, texts, self.cut, span, self.summary, self.dropped, kept
        )  # fmt: skip

    def report(self, before: int, after: int, exact: bool, fits: bool) -> Report:
        kept = self.lifted(self.cut)
        covered = len(msgs.spanned(self.original, self.head, self.cut, kept)) if self.cut else 0
        masked = sum(1 for i in self.maskable[: self.masked] if i >= self.cut)
        return Report(
            before, after, masked, len(self.clips), 0 if self.dropped else covered,
            covered if self.dropped else 0, self.summarizer if self.cut else None, exact, fits,
        )  # fmt: skip


async def condense(
    messages: Sequence[Message],
    knobs: Knobs,
    counter: Counter,
    summarize: Summarize,
    memory: Memory | None = None,
    extract: Summarize | None = None,
) -> Condensed | None:
    """``messages`` within ``knobs.budget`` (or as close as the ladder gets); None when
    they fit as they are (nothing to do, nothing to report). ``extract`` (the extractive
    summary: no model call) takes a clearing on to the low-water mark when masking leaves
    the room but not the mark; without it masking stops there."""
    before, exact = await counter.measure(messages)
    if before <= knobs.budget:
        return None
    plan = _Plan(messages, knobs, memory or Memory())
    plan.extract = extract
    for name, rung in RUNGS:
        if name not in knobs.rungs and name != "reuse":
            continue
        done = await rung(plan, counter, summarize)
        if done is not None:
            tokens, exact = done
            return Condensed(plan.build(), plan.report(before, tokens, exact, True), plan.memory())
    tokens, exact = await counter.measure(plan.build())
    fits = tokens <= knobs.budget
    return Condensed(plan.build(), plan.report(before, tokens, exact, fits), plan.memory())


async def _fits(plan: _Plan, counter: Counter, room: int = 0) -> tuple[int, bool] | None:
    """The request's tokens when they are within the budget less ``room``, else None."""
    tokens, exact = await counter.measure(plan.build())
    return (tokens, exact) if tokens <= plan.knobs.budget - room else None


async def _reuse(plan: _Plan, counter: Counter, summarize: Summarize) -> tuple[int, bool] | None:
    """What the previous step did, if it is enough: the same prefix again."""
    if not plan.masked and not plan.cut:
        return None
    return await _fits(plan, counter)


async def _mask(plan: _Plan, counter: Counter, summarize: Summarize) -> tuple[int, bool] | None:
    """Mask more of the oldest tool outputs: the fewest that bring the request to its
    low-water mark with at least ``clear_at_least`` tokens fewer than before this rung
    (all but the latest ``keep_tool_results`` when that is not enough). Done when that
    leaves the room; else recent outputs are masked too (never the latest), the fewest
    that leave it (with ``clear_to`` 1, no room asked, never). Left above the low-water
    mark, the clearing goes on to it with the extractive summary (``_to_mark``), before
    any recent output is masked."""
    knobs = plan.knobs
    if plan.masked < plan.normal:
        found = await _mask_to(plan, counter, plan.normal, knobs.low_water, knobs.clear_at_least)
        marked = await _to_mark(plan, counter, found)
        if marked[0] <= knobs.budget - knobs.room:
            return marked
    if plan.masked >= plan.reach:
        return None
    found = await _mask_to(plan, counter, len(plan.maskable), knobs.budget - knobs.room, 0)
    return found if found[0] <= knobs.budget - knobs.room else None


async def _to_mark(plan: _Plan, counter: Counter, found: tuple[int, bool]) -> tuple[int, bool]:
    """Masking the old outputs left the request above the low-water mark (the calls, the
    short outputs and the placeholders are more than the mark): the oldest turns are
    summarized by ``plan.extract`` to reach it, as the summary rung would, when that leaves
    the room; else, or without ``extract`` or the summary rung, the masking stands."""
    knobs = plan.knobs
    if plan.extract is None or "summarize" not in knobs.rungs or found[0] <= knobs.low_water:
        return found
    saved = plan.cut, plan.summary, plan.dropped, plan.summarizer
    done = await _summarize(plan, counter, plan.extract)
    if done is not None and done[0] <= min(found[0], knobs.budget - knobs.room):
        return done
    plan.cut, plan.summary, plan.dropped, plan.summarizer = saved
    return found


async def _mask_to(
    plan: _Plan, counter: Counter, limit: int, target: int, clear: int
) -> tuple[int, bool]:
    """The fewest of the first ``limit`` maskable outputs masked that bring the estimate to
    ``target`` with ``clear`` tokens fewer (all of them when none do), aiming lower when
    the tier's exact count says it missed; the request's tokens then."""
    start = counter.estimate(plan.build())
    first = plan.masked + 1
    for _ in range(EXACT_TRIES):

        def enough(k: int, target: int = target) -> bool:
            plan.masked = k
            estimate = counter.estimate(plan.build())
            return estimate <= target and start - estimate >= clear

        ks = list(range(first, limit + 1))
        plan.masked = _first(ks, enough) or limit
        tokens, exact = await counter.measure(plan.build())
        if tokens <= plan.knobs.budget - plan.knobs.room or plan.masked == limit:
            break
        # the tier counts more than the estimate: aim lower by what it found
        target -= tokens - counter.estimate(plan.build())
        first = plan.masked + 1
    return tokens, exact


async def _bare(plan: _Plan, counter: Counter, summarize: Summarize) -> tuple[int, bool] | None:
    """Every maskable output masked and still over: the placeholders without their digests,
    before anything is summarized (a digest is worth less than the turns a summary takes)."""
    if not plan.masked or plan.masked < plan.reach or not plan.bare():
        return None
    return await _fits(plan, counter, plan.knobs.room)


def _first(candidates: Sequence[int], ok: Callable[[int], bool]) -> int | None:
    """The first candidate ``ok`` holds for, by bisection (``ok`` is monotone in them)."""
    low, high = 0, len(candidates)
    while low < high:
        mid = (low + high) // 2
        if ok(candidates[mid]):
            high = mid
        else:
            low = mid + 1
    return candidates[low] if low < len(candidates) else None


async def _clip(plan: _Plan, counter: Counter, summarize: Summarize) -> tuple[int, bool] | None:
    """A kept tool output that alone takes over half the budget keeps its head and tail."""
    budget = plan.knobs.budget
    for i, m in enumerate(plan.original):
        if m.get("role") != "tool" or i in plan.maskable[: plan.masked]:
            continue
        tokens = counter.estimate([m])
        if tokens > CLIP_SHARE * budget:
            chars = len(msgs.text_of(m))
            plan.clips[i] = msgs.clipped(m, int(chars * CLIP_TO * budget / tokens))
    if not plan.clips:
        return None
    return await _fits(plan, counter, plan.knobs.room)


async def _summarize(
    plan: _Plan, counter: Counter, summarize: Summarize
) -> tuple[int, bool] | None:
    """Summarize from the system messages (or the previous summary's end) to the nearest
    cut that brings the request to its low-water mark with room for the summary, clearing
    at least ``clear_at_least``; when no cut that keeps ``keep_recent`` messages leaves the
    room, the nearest that does while keeping the latest turn only."""
    knobs = plan.knobs
    start = plan.cut or plan.head
    normal = msgs.cuts(plan.original, start, knobs.keep_recent)
    further = [c for c in msgs.cuts(plan.original, start, 1) if c not in normal]
    every = normal + (further if knobs.room else [])
    if not every:
        return None
    previous = plan.summary  # folded in, even when it was dropped for want of room
    before = counter.estimate(plan.build())
    missed = 0
    for _ in range(SUMMARY_TRIES):
        chosen = _summary_cut(plan, counter, normal, every, before, missed)
        kept = plan.lifted(chosen)
        text, by = await summarize(msgs.spanned(plan.original, start, chosen, kept), previous)
        plan.cut, plan.summary, plan.dropped, plan.summarizer = chosen, text, False, by
        tokens, exact = await counter.measure(plan.build())
        if tokens <= knobs.budget:  # the room was aimed at: not a second summary for it
            return tokens, exact
        if chosen == every[-1]:
            break
        missed += tokens - knobs.budget  # aim lower by what it missed, once more
    return None


def _summary_cut(
    plan: _Plan, counter: Counter, normal: list[int], every: list[int], before: int, missed: int
) -> int:
    """Where the summarized span ends: the nearest cut keeping ``keep_recent`` messages
    that reaches the low-water mark; else the furthest of those if it leaves the room;
    else the nearest of all that leaves it; else the furthest of all."""
    knobs = plan.knobs

    def estimate(c: int) -> int:
        return counter.estimate(plan.build(cut=c, summary="")) + knobs.summary_room + missed

    def enough(c: int) -> bool:
        return estimate(c) <= knobs.low_water and before - estimate(c) >= knobs.clear_at_least

    def roomy(c: int) -> bool:
        return estimate(c) <= knobs.budget - knobs.room

    found = _first(normal, enough)
    if found is None and normal and roomy(normal[-1]):
        found = normal[-1]
    if found is None:
        found = _first(every[len(normal) :], roomy)
    return every[-1] if found is None else found


async def _drop(plan: _Plan, counter: Counter, summarize: Summarize) -> tuple[int, bool] | None:
    """The last resort: the summarized span goes without its summary; when that is not
    enough (or nothing was summarized), the oldest turns go, as few as fit."""
    if plan.cut and not plan.dropped:
        plan.dropped = True
        found = await _fits(plan, counter)
        if found is not None:
            return found
    cuts = [c for c in msgs.cuts(plan.original, plan.head, plan.knobs.keep_recent) if c > plan.cut]
    if not cuts:
        return None
    plan.dropped, plan.summarizer = True, None
    before = counter.estimate(plan.build())

    def enough(c: int) -> bool:
        estimate = counter.estimate(plan.build(cut=c))
        return estimate <= plan.knobs.low_water and before - estimate >= plan.knobs.clear_at_least

    plan.cut = _first(cuts, enough) or cuts[-1]
    return await _fits(plan, counter)


RUNGS = (
    ("reuse", _reuse), ("mask", _mask), ("mask", _bare), ("mask", _clip),
    ("summarize", _summarize),
    ("drop", _drop),
)  # fmt: skip
