"""The extractive summarizer: no model call, the lines worth keeping, verbatim.

It keeps the lines that carry what an agent needs later — numbers and values, file
paths, identifiers, errors, decisions — plus the task and the calls already made (DONE),
under the same headings the fast tier's summary has, so either can fold into the other.
It is the baseline the model-written summary is measured against, and the fallback when
the fast tier fails or is too slow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


def summarize(messages: Sequence[Message], previous: str | None, max_chars: int) -> str:
    """A structured summary of ``messages`` (with ``previous``, an earlier summary, folded
    in first), at most ``max_chars`` characters: when the lines do not fit, the latest
    ones win within each section, and facts go before decisions."""
    task: list[str] = []
    done: list[str] = []
    facts: list[str] = []
    decisions: list[str] = []
    pending: list[str] = []
    files: list[str] = []
    numbers: list[str] = []  # lines with numbers and nothing else worth keeping: room left
    seen: set[str] = set()
    sections = {
        "Task": task, "Facts and values learned": facts, "Files touched": files,
        "DONE (tool calls already made)": done, "Decisions": decisions, "Pending": pending,
        "Other values": numbers,
    }  # fmt: skip
    _fold(previous or "", sections, seen)
    for m in messages:
        role = m.get("role")
        text = text_of(m)
        if role == "user":
            for line in lines_of(text)[:3]:
                _add(task, seen, line[:LINE_CHARS])
        for call in _calls(m):
            _add(done, seen, call)
        for line in lines_of(text):
            for path in PATH.findall(line):
                if path not in files:
                    files.append(path)
            if is_fact(line):
                _add(facts, seen, around(line, *FACT_KINDS, NUMBER))
            elif NUMBER.search(line):
                _add(numbers, seen, around(line, NUMBER))
            elif role == "assistant" and DECISION.search(line):
                _add(decisions, seen, around(line, DECISION))
            elif role == "assistant" and PENDING.search(line):
                _add(pending, seen, around(line, PENDING))
    return _fit(list(sections.items()), max_chars)


def _fold(previous: str, sections: dict[str, list[str]], seen: set[str]) -> None:
    """An earlier summary's lines, first in their sections (a heading it shares with
    ours) or among the facts (a model-written summary's other lines)."""
    bucket = sections["Facts and values learned"]
    for line in lines_of(previous):
        title = line.rstrip(":").strip()
        if line.endswith(":") and title in sections:
            bucket = sections[title]
            continue
        item = line[2:] if line.startswith("- ") else line
        if bucket is sections["Files touched"]:
            if item not in bucket:
                bucket.append(item)
        else:
            _add(bucket, seen, item[:LINE_CHARS])


def _fit(sections: list[tuple[str, list[str]]], max_chars: int) -> str:
    """Sections under ``max_chars``, each with a share of the room. A section with more
    lines than its share keeps lines spread evenly over it, the first and the last
    included: a value printed early matters as much as one printed late."""
    titled = [(t, lines) for t, lines in sections if lines]
    weights = [FACT_WEIGHT if t.startswith("Facts") else 1 for t, _ in titled]
    unit = max_chars / max(1, sum(weights))
    out = []
    for (title, lines), weight in zip(titled, weights, strict=True):
        share = max(80, int(unit * weight) - 40)
        low, high = 1, len(lines)  # the most lines that fit, spread evenly
        while low < high:
            mid = (low + high + 1) // 2
            if sum(len(ln) + 3 for ln in spread(lines, mid)) <= share:
                low = mid
            else:
                high = mid - 1
        out.append(f"{title}:\n" + "\n".join(f"- {ln}" for ln in spread(lines, low)))
    return "\n".join(out)[:max_chars]


def spread(lines: Sequence[T], count: int) -> list[T]:
    """``count`` of ``lines``, evenly spaced, the first and (for two or more) the last."""
    if count >= len(lines):
        return list(lines)
    if count == 1:
        return list(lines[:1])
    return [lines[round(i * (len(lines) - 1) / (count - 1))] for i in range(count)]
