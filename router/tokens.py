"""Prompt tokens of a request as the tier will count them, estimated without a tokenizer call.

What a tier reads is not the messages' text alone: its chat template adds a system turn (a
default one when the client sent none), a few tokens around every message, and, when tools
are offered, a preamble and every tool's JSON schema; tool calls come back as JSON too.
Characters / 4 over the message text missed all of that: on the router's evaluation set it
was off by a median of 49% and by 16x on function-calling requests, whose schemas outweigh
the question (docs/router.md, "Token counts").

So the estimate is a linear model over a few counts that cost one pass over the strings at C
speed (digits, symbols and wide bytes are counted in the request's last 8 KB of text and
scaled to the rest):

    tokens ~ base + no_system * [no system message] + per_message * messages
             + per_char * characters + per_digit * digits + per_symbol * symbols
             + tools * [tools offered] + per_json_char * (tool schemas + tool calls, as JSON)
             + per_call * tool calls + per_wide_byte * (UTF-8 bytes beyond one a character)

(messages: those other than tool calls and tool results, which come with their call.)
``DEFAULT`` is fitted to the embedded model family (SmolLM2's tokenizer over Gearshift's
ChatML template; ``python -m bench.token_estimate``). At start-up the gateway checks it
against the full tier's own tokenizer and template through vLLM's ``/tokenize``
(``gateway.routing.calibration``) and, for another family, fits weights of its own; then it
refits them to the tiers' own counts of the prompts they serve. What it finds is logged.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson

# isinstance's second argument on the hot path: a tuple (``dict | Mapping`` builds a union
# object at every call, and checks dicts several times slower)
MAPS = (dict, Mapping)
LISTS = (list, Sequence)
DIGIT_BUDGET = 8192  # characters, the latest, in which digits and symbols are counted (then scaled)
MAX_TOOLS = 64  # tool schemas serialized; the rest are assumed to be the same size on average
DIGITS = b"0123456789"
SYMBOLS = b"\n{}()[]<>;:,.=+-*/\\\"'`#_|&%$@!?~^"


@dataclass(frozen=True, slots=True)
class Counts:
    """What the estimate is a linear function of; ``tokens.counts(body)``."""

    no_system: float = 0.0
    messages: float = 0.0  # the others: system, user and assistant text
    chars: float = 0.0
    digits: float = 0.0
    symbols: float = 0.0
    tools: float = 0.0
    json_chars: float = 0.0
    calls: float = 0.0  # each with its result: a tool loop's step, wrapped by the template
    wide: float = 0.0  # UTF-8 bytes beyond one a character: text in scripts other than ASCII
    token_ids: int = 0  # a completions prompt given as token ids: counted, not estimated

    def vector(self) -> list[float]:
        """``[1, no_system, messages, ...]``: the design row ``TokenModel`` weights."""
        return [1.0, *_weighted(self)]


_WEIGHTED = tuple(f.name for f in fields(Counts) if f.name != "token_ids")
_weighted = operator.attrgetter(*_WEIGHTED)  # one C call for the row, every request
# the row's terms for what appended messages add: all but base and the fixed parts of the
# template (the default system prompt, the tools block), which a conversation pays once
_APPENDED = tuple(i for i, name in enumerate(("base", *_WEIGHTED)) if name not in
                  ("base", "no_system", "tools"))  # fmt: skip
NOTHING = Counts()


@dataclass(frozen=True, slots=True)
class TokenModel:
    """Tokens per unit of each count (``Counts``); ``base`` is the template's fixed part."""

    base: float
    no_system: float
    per_message: float
    per_char: float
    per_digit: float
    per_symbol: float
    tools: float
    per_json_char: float
    per_call: float
    per_wide_byte: float = 0.0
    source: str = "default"  # where the weights came from, for logs and records

    def weights(self) -> list[float]:
        return [
            self.base, self.no_system, self.per_message, self.per_char, self.per_digit, self.per_symbol,
            self.tools, self.per_json_char, self.per_call, self.per_wide_byte,
        ]  # fmt: skip

    @classmethod
    def from_weights(cls, weights: Sequence[float], source: str) -> TokenModel:
        names = [f.name for f in fields(cls) if f.name != "source"]
        values: dict[str, Any] = dict(zip(names, map(float, weights), strict=True))
        return cls(**values, source=source)

    def estimate(self, body: Mapping[str, Any]) -> int:
        return self.estimate_counts(counts(body))

    def estimate_counts(self, c: Counts) -> int:
        if c == NOTHING:  # no prompt at all (a malformed body): nothing for the template either
            return 0
        if c.token_ids and not c.chars:
            return c.token_ids
        total: float = sum(map(operator.mul, self.weights(), c.vector()))  # len 10 each, in order
        return max(0, round(total)) + c.token_ids

    def appended(self, c: Counts) -> float:
        """Tokens for what ``c`` counts beyond the template's fixed parts (base, the default
        system prompt, the tools block): what messages appended to a conversation add."""
        w, x = self.weights(), c.vector()
        return sum([w[i] * x[i] for i in _APPENDED])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Fitted (``python -m bench.token_estimate``) to the exact counts of the embedded full tier
# (SmolLM2's tokenizer over Gearshift's chat template, through vLLM's /tokenize) of 1,704
# requests: the router's evaluation set, MT-Bench, and 300 synthetic agent sessions.
DEFAULT = TokenModel(
    base=11.4776, no_system=9.5589, per_message=10.0324, per_char=0.2027, per_digit=0.9841,
    per_symbol=0.4169, tools=68.681, per_json_char=0.2565, per_call=23.4129,
    per_wide_byte=0.7325,  # fitted to 300 requests in eleven languages (bench.multilingual)
)  # fmt: skip


def _classes(texts: list[str], chars: int) -> tuple[float, float, float]:
    """(digits, symbols, wide bytes) in ``texts`` (``chars`` characters in all): counted
    exactly in the last DIGIT_BUDGET characters (the latest messages, which an agent's
    request ends with) and scaled to the rest by their density, in C passes: bounded
    whatever the request's size. Symbols are punctuation, brackets and line breaks, which
    code and JSON are dense in and which merge into few tokens with the letters around
    them; wide bytes are UTF-8 bytes beyond one a character (Cyrillic and Greek 1 more,
    Han and Kana 2, emoji 3), which a tokenizer trained mostly on English splits into
    several tokens a character."""
    if not chars:
        return 0.0, 0.0, 0.0
    sample: list[str] = []
    room = DIGIT_BUDGET
    for text in reversed(texts):
        sample.append(text if len(text) <= room else text[-room:])
        room -= len(sample[-1])
        if room <= 0:
            break
    raw = "".join(sample).encode("utf-8", "surrogatepass")
    seen = DIGIT_BUDGET - max(room, 0)
    if not seen:
        return 0.0, 0.0, 0.0
    digits = len(raw) - len(raw.translate(None, DIGITS))
    symbols = len(raw) - len(raw.translate(None, SYMBOLS))
    wide = max(0, len(raw) - seen)
    scale = chars / seen
    return digits * scale, symbols * scale, wide * scale


Marks = tuple[int, int, int]  # one text's digits, symbols and UTF-8 bytes (``_marks``)


def _marks(text: str) -> Marks:
    """What ``_classes`` counts in ``text``: its digits, symbols and UTF-8 bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    n = len(raw)
    return n - len(raw.translate(None, DIGITS)), n - len(raw.translate(None, SYMBOLS)), n


UNMARKED: Marks = (0, 0, 0)  # a text longer than the budget: only ever read in part


def _mark(text: str) -> Marks:
    """``_marks`` of a text the budget may hold whole (bounded work: a huge message is not
    counted here; ``_classes_marked`` counts the part of it the budget reaches)."""
    return _marks(text) if len(text) <= DIGIT_BUDGET else UNMARKED


def _marked(texts: tuple[str, ...]) -> tuple[Marks, ...]:
    """The ``_mark`` of each of ``_latest``'s texts; none for the oldest when the budget
    holds only part of it: read in part now, it only ever is (texts are only appended)."""
    if sum(map(len, texts)) > DIGIT_BUDGET:
        return (UNMARKED, *map(_mark, texts[1:]))
    return tuple(map(_mark, texts))


def _classes_marked(
    texts: Sequence[str], marks: Sequence[Marks], chars: int
) -> tuple[float, float, float]:
    """``_classes(texts, chars)`` from each text's ``_marks``, counted once when the text
    was read: only the oldest text the budget reaches into is counted again (the part of it
    the budget holds). The same figures, since digits and symbols are single bytes and each
    text is encoded on its own either way."""
    if not chars:
        return 0.0, 0.0, 0.0
    room = DIGIT_BUDGET
    digits = symbols = size = 0
    for i in range(len(texts) - 1, -1, -1):
        text = texts[i]
        if len(text) <= room:
            d, s, n = marks[i]
            room -= len(text)
        else:
            d, s, n = _marks(text[-room:])
            room = 0
        digits, symbols, size = digits + d, symbols + s, size + n
        if room <= 0:
            break
    seen = DIGIT_BUDGET - max(room, 0)
    if not seen:
        return 0.0, 0.0, 0.0
    wide = max(0, size - seen)
    scale = chars / seen
    return digits * scale, symbols * scale, wide * scale


def _content(content: object, texts: list[str]) -> int:
    """Characters of a message's text (a string, or its text parts), appended to ``texts``."""
    if isinstance(content, str):
        texts.append(content)
        return len(content)
    chars = 0
    if isinstance(content, list):
        for part in content:
            text = part.get("text") if isinstance(part, MAPS) else None
            if isinstance(text, str):
                texts.append(text)
                chars += len(text)
    return chars


def _json_len(value: object) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):  # not JSON, or nested past the stack
        return 0


def _tools_len(tools: Sequence[Any]) -> int:
    """``_json_len`` summed over the tool schemas. An agent sends the same tools at every
    step: they are looked up by their compact serialization (a twentieth of the cost of
    the standard library's, whose lengths the token model was fitted on)."""
    try:
        key = orjson.dumps(tools)
    except (TypeError, orjson.JSONEncodeError):
        return sum(_json_len(t) for t in tools)
    return _tools_len_of(key)


@functools.lru_cache(maxsize=1024)
def _tools_len_of(key: bytes) -> int:
    return sum(_json_len(t) for t in orjson.loads(key))


@dataclass(frozen=True, slots=True)
class Sums:
    """What ``counts`` adds up over a chat request's messages, read one message after
    another: a session's next step, which resends this step's messages and appends a few,
    extends these sums with what it appends (``router.analysis.Tally``) and gets the counts
    a reading of all its messages gives."""

    opened: bool = False  # a message was read
    system: bool = False  # the first one read is a system message
    messages: int = 0  # Counts.messages
    chars: int = 0
    json_chars: int = 0  # of the tool calls (the offered tools are the request's own)
    calls: int = 0
    texts: tuple[str, ...] = ()  # the latest texts, DIGIT_BUDGET characters of them (or all)
    # each text's ``_marks``, counted once, when sums were first joined to these (empty: not
    # counted: a reading afresh counts the latest texts in one pass, ``_classes``)
    marks: tuple[Marks, ...] = field(default=(), compare=False, repr=False)

    def extended(self, messages: Iterable[Any]) -> Sums:
        """The sums over the messages read so far followed by ``messages``."""
        if self.opened:
            return self.joined(NO_SUMS.extended(messages))
        texts = list(self.texts)
        opened: bool = False  # (these sums are empty: a non-empty one joins instead)
        system = self.system
        chars, calls, json_chars, plain = self.chars, self.calls, self.json_chars, self.messages
        for m in messages:
            if not isinstance(m, MAPS):
                continue
            if not opened:
                opened, system = True, m.get("role") == "system"
            chars += _content(m.get("content"), texts)
            tool_calls = m.get("tool_calls")
            plain += m.get("role") != "tool" and not (isinstance(tool_calls, list) and tool_calls)
            if isinstance(tool_calls, list):
                for call in tool_calls:
                    fn = call.get("function") if isinstance(call, MAPS) else None
                    if not isinstance(fn, MAPS):
                        continue
                    calls += 1
                    name, args = fn.get("name"), fn.get("arguments")
                    json_chars += len(name) if isinstance(name, str) else 0
                    if isinstance(args, str):
                        texts.append(args)
                        json_chars += len(args)
                    else:
                        json_chars += _json_len(args)
        return Sums(opened, system, plain, chars, json_chars, calls, _latest(texts))

    def joined(self, after: Sums) -> Sums:
        """The sums over these messages followed by those ``after`` sums up: what
        ``extended`` with its messages gives (``after``: ``Sums().extended`` of them)."""
        if not after.opened:
            return self
        if not self.opened:
            return after
        texts = _latest([*self.texts, *after.texts])
        k, m = len(texts), len(after.texts)  # texts: the last k of both, empty ones left out
        new = after.marks if len(after.marks) == m else _marked(after.texts)
        if k <= m:
            marks = new[m - k :]
        else:  # the newest k - m of these texts are carried over: marked once, here or before
            carried = k - m
            old = self.marks[len(self.marks) - carried :]
            if len(self.marks) != len(self.texts):  # read afresh last time: marked now
                old = _marked(self.texts[len(self.texts) - carried :])
            marks = old + new
        return Sums(
            True, self.system, self.messages + after.messages, self.chars + after.chars,
            self.json_chars + after.json_chars, self.calls + after.calls, texts, marks,
        )  # fmt: skip

    def counts(self, tools: object) -> Counts:
        """The request's counts: these messages' with ``tools`` offered."""
        chars = self.chars + self.json_chars
        if len(self.marks) == len(self.texts):
            digits, symbols, wide = _classes_marked(self.texts, self.marks, chars)
        else:
            digits, symbols, wide = _classes(list(self.texts), chars)
        json_chars = self.json_chars
        offered = tools if isinstance(tools, list) else ()
        if offered:
            sample = offered[:MAX_TOOLS]
            json_chars += round(_tools_len(sample) * len(offered) / len(sample))
        return Counts(
            no_system=float(not self.system),
            messages=float(self.messages),
            chars=float(self.chars),
            digits=digits,
            symbols=symbols,
            tools=float(bool(offered)),
            json_chars=float(json_chars),
            calls=float(self.calls),
            wide=wide,
        )


def _latest(texts: list[str]) -> tuple[str, ...]:
    """The shortest tail of ``texts`` that holds DIGIT_BUDGET characters (all of them when
    they hold fewer), empty ones left out: the part ``_classes`` reads."""
    kept: list[str] = []
    room = DIGIT_BUDGET
    for text in reversed(texts):
        if text:
            kept.append(text)
            room -= len(text)
            if room <= 0:
                break
    kept.reverse()
    return tuple(kept)


NO_SUMS = Sums()


def counts(body: Mapping[str, Any], sums: Sums | None = None) -> Counts:
    """What the estimate of ``body``'s prompt tokens is made of; ``sums``: its messages'
    ``Sums`` when the caller has them."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return _prompt_counts(body.get("prompt"))
    return (Sums().extended(messages) if sums is None else sums).counts(body.get("tools"))


def _prompt_counts(prompt: object) -> Counts:
    """A completions request's counts."""
    texts: list[str] = []
    if isinstance(prompt, str):
        digits, symbols, wide = _classes([prompt], len(prompt))
        return Counts(chars=float(len(prompt)), digits=digits, symbols=symbols, wide=wide)
    if isinstance(prompt, list):  # a batch of prompts, token ids, or batches of ids
        chars, ids = 0, 0
        for p in prompt:
            if isinstance(p, str):
                texts.append(p)
                chars += len(p)
            elif isinstance(p, list):
                ids += len(p)
            else:
                ids += 1
        digits, symbols, wide = _classes(texts, chars)
        return Counts(chars=float(chars), digits=digits, symbols=symbols, wide=wide, token_ids=ids)
    return Counts()


FINGERPRINT_CHARS = 256  # read at each end of a message's text to recognise it
FINGERPRINT_CALLS = 16


def fingerprint(message: object) -> int:
    """A cheap identity for one message (role, text, tool calls): bounded work whatever its
    size. In-process only (Python's string hash is seeded per process)."""
    if not isinstance(message, MAPS):
        return 0
    texts: list[str] = []
    _content(message.get("content"), texts)
    text = "\x00".join(texts)
    calls = message.get("tool_calls")
    parts: list[object] = [message.get("role"), message.get("tool_call_id"), len(text)]
    parts += (text[:FINGERPRINT_CHARS], text[-FINGERPRINT_CHARS:])
    if isinstance(calls, list):
        for call in calls[:FINGERPRINT_CALLS]:
            fn = call.get("function") if isinstance(call, MAPS) else None
            if isinstance(fn, MAPS):
                args = fn.get("arguments")
                args = args if isinstance(args, str) else str(_json_len(args))
                parts += (fn.get("name"), args[:FINGERPRINT_CHARS], len(args))
    return hash(tuple(parts))


def position(body: Mapping[str, Any]) -> tuple[int, int] | None:
    """(how many messages, the last one's fingerprint): where a chat request ends, which
    the session's next request must repeat to be sized from this one's exact count."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    return len(messages), fingerprint(messages[-1])


@dataclass(frozen=True, slots=True)
class Anchor:
    """A session's last routed step as the tier counted it (``usage.prompt_tokens``).

    An agent resends its whole conversation at every step, so the next step's prompt is
    this one's plus what came since (the answer, tool results, a new user turn). Sized
    from here, the estimate's error is confined to that difference instead of growing with
    the conversation (``anchored``)."""

    messages: int  # the step's messages
    last: int  # ``fingerprint`` of its last message
    counts: Counts  # what its estimate was made of
    tokens: int  # what the tier counted


def anchored(
    model: TokenModel,
    sizes: Counts,
    body: Mapping[str, Any],
    anchor: Anchor | None,
    added: Sums | None = None,
) -> tuple[int, bool]:
    """(the prompt tokens of ``body``, whether they were sized from ``anchor``).

    The anchor applies when ``body`` only appends to the anchored step's conversation: at
    least as many messages, the same message where that step's ended, and every additive
    count (characters, tool-call JSON, messages, calls) grown by exactly what the appended
    messages hold, with the same tools offered. Anything else — a client that compacted
    or edited its history, changed its tools — is estimated afresh. The tokens are then
    the anchored step's exact count plus ``model``'s estimate of the appended messages
    alone (their digits and symbols counted in them, not in the whole). ``added``: the
    ``Sums`` of ``body``'s messages after the anchored step's, when the caller has them."""
    estimate = model.estimate_counts(sizes)
    if anchor is None or sizes.token_ids or anchor.tokens <= 0:
        return estimate, False
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < anchor.messages:
        return estimate, False
    if fingerprint(messages[anchor.messages - 1]) != anchor.last:
        return estimate, False
    after = messages[anchor.messages :]
    more = (NO_SUMS.extended(after) if added is None else added).counts(None)
    before = anchor.counts
    grown = (
        sizes.no_system == before.no_system
        and sizes.tools == before.tools
        and sizes.chars == before.chars + more.chars
        and sizes.json_chars == before.json_chars + more.json_chars
        and sizes.messages == before.messages + more.messages
        and sizes.calls == before.calls + more.calls
    )
    if not grown:
        return estimate, False
    return anchor.tokens + max(0, round(model.appended(more))), True


def estimate_prompt_tokens(body: Mapping[str, Any], model: TokenModel | None = None) -> int:
    """The tokens the tier will read for this chat or completions body (``DEFAULT`` unless
    a model calibrated against the serving tier is given)."""
    return (model or DEFAULT).estimate(body)
