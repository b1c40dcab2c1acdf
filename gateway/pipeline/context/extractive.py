"""The extractive summarizer: no model call, the lines worth keeping, verbatim.

It keeps the lines that carry what an agent needs later — numbers and values, file
paths, identifiers, errors, decisions — plus the task and the calls already made (DONE),
under the same headings the fast tier's summary has, so either can fold into the other.
It is the baseline the model-written summary is measured against, and the fallback when
the fast tier fails or is too slow.

On real tool output nearly every line has a number, path or identifier, so the facts are
ranked rather than sampled (``score``): errors, named values, totals, values and
identifiers seen nowhere before, tokens rare across the span and each output's first and
last line count; a line shaped like one already in its output (log spam) counts less.
The room is spread across the sources (``pick``): every tool output keeps its best line
before any keeps a second.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from gateway.pipeline.context.messages import Message, text_of

# possessive (++) where backtracking cannot find another match: these run on every line
PATH = re.compile(
    r"(?<![\w.-])(?:[\w.-]++/)+[\w.-]+|\b[\w-]++\.(?:py|js|ts|go|rs|java|c|h|cpp|md|json|ya?ml|toml|txt|csv|log|sh|sql|html|css)\b"
)
NUMBER = re.compile(r"\d")
IDENT = re.compile(r"\b[a-z]++_[a-z0-9_]+\b|\b[a-z]++[A-Z]\w*\b|`[^`]+`")
ERROR_WORDS = r"error|exception|traceback|failed|failure|denied|not found|invalid|refused|timeout|exit (?:code|status)"
ERROR = re.compile(ERROR_WORDS, re.I)
ERROR_LOWER = re.compile(ERROR_WORDS)  # on a lowercased line: many times faster than re.I
DECISION = re.compile(
    r"\b(?:decided|decide|chose|choose|will|plan|instead|must|should|conclude|because|so that)\b",
    re.I,
)
KEY_VALUE = re.compile(r"\b[\w.-]++\s*+[=:]\s*\S")  # a named value: port = 8080, code: E42
FACT_KINDS = (ERROR, PATH, IDENT, KEY_VALUE)  # a line with one of these is a fact
PENDING = re.compile(r"\b(?:todo|next|pending|remaining|still need|not yet|then)\b", re.I)
# what a later question names or asks for: values with a digit, snake_case identifiers
VALUE_TOKEN = re.compile(r"[\w./#-]*\d[\w./#-]*|\b[a-z]++_\w+")
DIGITS = re.compile(r"\d+")
ESCAPED_LINES = re.compile(r"\r?\n|\\n")  # a newline, or one escaped in JSON
TOTAL = re.compile(
    r"\b(?:total|totals|sum|count|overall|summary|result|wrote|written|saved|created|generated)\b",
    re.I,
)
NOVEL_CAP = 3.0  # what new and rare tokens add to a line's score, at most
T = TypeVar("T")
FACT_WEIGHT = 3  # the facts' section gets this many shares of the room, the others one
LINE_CHARS = 160  # one kept line at most: around what made it worth keeping
SCAN_CHARS = 4 * LINE_CHARS  # of each line, searched


def is_error(line: str) -> bool:
    return ERROR_LOWER.search(line.lower()) is not None


def is_fact(line: str) -> bool:
    """Whether ``line`` names something an agent needs later (one of FACT_KINDS)."""
    return is_error(line) or any(k.search(line) for k in (KEY_VALUE, PATH, IDENT))


def lines_of(text: str) -> list[str]:
    """Non-blank lines, each cut to what the patterns look at (long ones are data dumps)."""
    return [ln.strip()[:SCAN_CHARS] for ln in text.splitlines() if ln.strip()]


def output_lines(text: str) -> list[str]:
    """``lines_of``, with a JSON-escaped newline (a file tool's output as JSON, maybe cut
    short) ending a line too: a file read is its lines, not one blob."""
    return [ln.strip()[:SCAN_CHARS] for ln in ESCAPED_LINES.split(text) if ln.strip()]


def around(line: str, *patterns: re.Pattern[str]) -> str:
    """``line`` cut to LINE_CHARS around the first thing a pattern finds in it."""
    if len(line) <= LINE_CHARS:
        return line
    starts = [m.start() for p in patterns if (m := p.search(line)) is not None]
    start = max(0, min(starts, default=0) - LINE_CHARS // 3)
    return line[start : start + LINE_CHARS]


def _calls(message: Message) -> list[str]:
    out = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            shown = args if isinstance(args, str) else ""
            out.append(f"{fn.get('name')}({shown[:LINE_CHARS]})")
    return out


def _add(bucket: list[str], seen: set[str], line: str) -> None:
    if line not in seen:
        seen.add(line)
        bucket.append(line)


@dataclass
class Candidate:
    """A fact line from ``source`` (the message's index; negative: a line of the previous
    summary)."""

    source: int
    text: str
    score: float = 0.0


def score(line: str, *, first: bool, last: bool, repeats: int, novel: float) -> float:
    """How much ``line`` is worth keeping: its kinds of fact, what it adds (``novel``: new
    and rare tokens), its place in its output (``first``/``last``), damped by ``repeats``
    (earlier lines of its output with the same shape: log spam)."""
    value = 0.0
    if is_error(line):
        value += 3
    if KEY_VALUE.search(line):
        value += 2
    if TOTAL.search(line):
        value += 2
    value += sum(1 for kind in (PATH, IDENT) if kind.search(line))
    value += 0.5 if NUMBER.search(line) else 0.0
    value += min(NOVEL_CAP, novel) + (1 if first or last else 0)
    return value / (1 + repeats)


def rank(sources: Sequence[tuple[int, Sequence[str]]]) -> list[Candidate]:
    """The fact lines of ``sources`` (index, lines in order), each scored: a token seen in
    no earlier line adds one, one that no other source has adds a half."""
    spread_in = Counter(tok for _, lines in sources for tok in {*_tokens(lines)})
    known: set[str] = set()
    out: list[Candidate] = []
    for source, lines in sources:
        shapes: Counter[str] = Counter()
        for i, line in enumerate(lines):
            tokens = set(VALUE_TOKEN.findall(line))
            novel = len(tokens - known) + 0.5 * sum(spread_in[t] == 1 for t in tokens)
            known |= tokens
            shape = DIGITS.sub("#", line.lower())
            value = score(
                line, first=i == 0, last=i == len(lines) - 1, repeats=shapes[shape], novel=novel
            )
            shapes[shape] += 1
            out.append(Candidate(source, line, value))
    return out


def _tokens(lines: Sequence[str]) -> list[str]:
    return [tok for line in lines for tok in VALUE_TOKEN.findall(line)]


def pick(candidates: Sequence[Candidate], room: int) -> list[str]:
    """Lines of ``candidates`` within ``room`` characters (3 more each, for "- " and the
    newline), in their order: round by round, each source's next best line, the round's
    lines best first (ties spread over the sources, the first and the last first). The
    previous summary's lines (negative sources: each was its source's pick, and that
    source is gone) come first, in at most half the room."""
    by_source: dict[int, list[int]] = {}
    for i, c in enumerate(candidates):
        by_source.setdefault(c.source, []).append(i)
    order = {key: n for n, key in enumerate(spread_order(list(by_source)))}
    queue = []
    for key, members in by_source.items():
        best = sorted(members, key=lambda i: -candidates[i].score)
        queue += [(turn, -candidates[i].score, order[key], i) for turn, i in enumerate(best)]
    kept: set[int] = set()
    earlier = room // 2  # the previous summary's lines first, in at most half the room
    for i, c in enumerate(candidates):
        if c.source < 0 and len(c.text) + 3 <= earlier:
            kept.add(i)
            earlier -= len(c.text) + 3
            room -= len(c.text) + 3
    for *_, i in sorted(queue):
        if i in kept:
            continue
        cost = len(candidates[i].text) + 3
        if cost <= room:
            kept.add(i)
            room -= cost
    return [c.text for i, c in enumerate(candidates) if i in kept]


def spread_order(items: Sequence[T]) -> list[T]:
    """``items`` in the order ever finer even spreads (``spread`` of 1, 2, 4, 8 ...) take
    them: the first, the last, then points between, each spread's new ones in order."""
    out: list[T] = []
    taken: set[int] = set()
    count = 1
    while len(out) < len(items):
        for index in spread(range(len(items)), count):
            if index not in taken:
                taken.add(index)
                out.append(items[index])
        count = min(len(items), count * 2)
    return out


def summarize(messages: Sequence[Message], previous: str | None, max_chars: int) -> str:
    """A structured summary of ``messages`` (with ``previous``, an earlier summary, folded
    in first), at most ``max_chars`` characters. The facts are ranked (``rank``) and the
    room they get spread over their sources (``pick``); the other sections keep lines
    spread evenly over them when they do not all fit."""
    task: list[str] = []
    done: list[str] = []
    facts: list[str] = []  # the previous summary's; the span's are ranked
    decisions: list[str] = []
    pending: list[str] = []
    files: list[str] = []
    seen: set[str] = set()
    sections = {
        "Task": task, "Facts and values learned": facts, "Files touched": files,
        "DONE (tool calls already made)": done, "Decisions": decisions, "Pending": pending,
    }  # fmt: skip
    _fold(previous or "", sections, seen)
    sources: list[tuple[int, list[str]]] = []
    for index, m in enumerate(messages):
        role = m.get("role")
        text = text_of(m)
        if role == "user":
            for line in lines_of(text)[:3]:
                _add(task, seen, line[:LINE_CHARS])
        for call in _calls(m):
            _add(done, seen, call)
        found: list[str] = []
        for line in output_lines(text):
            for path in PATH.findall(line):
                if path not in files:
                    files.append(path)
            if is_fact(line) or NUMBER.search(line):
                _add(found, seen, around(line, *FACT_KINDS, NUMBER))
            elif role == "assistant" and DECISION.search(line):
                _add(decisions, seen, around(line, DECISION))
            elif role == "assistant" and PENDING.search(line):
                _add(pending, seen, around(line, PENDING))
        if found:
            sources.append((index, found))
    # each line of the previous summary was its source's pick: a source of its own
    earlier = [(-1 - k, [line]) for k, line in enumerate(facts)]
    return _fit(list(sections.items()), rank(earlier + sources), max_chars)


def _fold(previous: str, sections: dict[str, list[str]], seen: set[str]) -> None:
    """An earlier summary's lines, first in their sections (a heading it shares with
    ours) or among the facts (a model-written summary's other lines, and the values an
    earlier version of this summarizer kept apart)."""
    bucket = sections["Facts and values learned"]
    for line in lines_of(previous):
        title = line.rstrip(":").strip()
        if line.endswith(":") and (title in sections or title == "Other values"):
            bucket = sections.get(title, sections["Facts and values learned"])
            continue
        item = line[2:] if line.startswith("- ") else line
        if bucket is sections["Files touched"]:
            if item not in bucket:
                bucket.append(item)
        else:
            _add(bucket, seen, item[:LINE_CHARS])


def _fit(sections: list[tuple[str, list[str]]], facts: list[Candidate], max_chars: int) -> str:
    """Sections under ``max_chars``. Each section but the facts keeps at most its share
    of the room, lines spread evenly over it (the first and the last included: a value
    printed early matters as much as one printed late); the facts get their share and
    whatever the others leave."""
    titled = [(t, lines) for t, lines in sections if lines or (t.startswith("Facts") and facts)]
    weights = [FACT_WEIGHT if t.startswith("Facts") else 1 for t, _ in titled]
    unit = max_chars / max(1, sum(weights))
    blocks: dict[str, str] = {}
    for title, lines in titled:
        if title.startswith("Facts"):
            continue
        share = max(80, int(unit) - 40)
        low, high = 1, len(lines)  # the most lines that fit, spread evenly
        while low < high:
            mid = (low + high + 1) // 2
            if sum(len(ln) + 3 for ln in spread(lines, mid)) <= share:
                low = mid
            else:
                high = mid - 1
        blocks[title] = f"{title}:\n" + "\n".join(f"- {ln}" for ln in spread(lines, low))
    for title, _ in titled:
        if title.startswith("Facts"):
            room = max_chars - sum(len(b) + 1 for b in blocks.values()) - len(title) - 2
            kept = pick(facts, max(room, 0))
            if kept:
                blocks[title] = f"{title}:\n" + "\n".join(f"- {ln}" for ln in kept)
    return "\n".join(blocks[t] for t, _ in titled if t in blocks)[:max_chars]


def spread(lines: Sequence[T], count: int) -> list[T]:
    """``count`` of ``lines``, evenly spaced, the first and (for two or more) the last."""
    if count >= len(lines):
        return list(lines)
    if count == 1:
        return list(lines[:1])
    return [lines[round(i * (len(lines) - 1) / (count - 1))] for i in range(count)]
