"""The writer's side of prompt ids by reference (the layout: ``gateway.store.prompt_refs``).

For each session the writer keeps its last step's prompt ids as the JSON bytes vLLM sent
(``RawJson``: never parsed on the request path) and that step's completion ids per choice.
The next step's prompt is compared with them as bytes: an agent's prompt starts with the
previous prompt's exact bytes, so one ``startswith`` finds the shared part, and only the
new tail (a few hundred ids) is parsed into ints and packed. Parsing and packing a whole
prompt of an agent 14 tool calls in (about 9,850 ids) was the writer's largest cost.

When the bytes part earlier (the history was condensed, edited, or another branch of the
session answered last) the shared part is the common byte prefix cut back to the last whole
id; a short one (under ``MIN_SHARED`` ids) is not worth a reference and the prompt is
stored whole, as it is for a session's first step and after the cache forgot the session.

A prompt stored whole is still not parsed whole when it begins like the last prompt stored
whole (``Template``): new sessions of one agent open with the same system prompt and tool
definitions, thousands of ids, and those are copied packed from that prompt; only the ids
after the shared bytes are parsed. What is stored is the same bytes either way.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from gateway.recording.records import RawJson

MIN_SHARED = 64  # ids; fewer are stored again rather than referenced
_SEPARATORS = (b",", b"]")


@dataclass(slots=True)
class Last:
    """A session's last step with prompt ids: the prompt as JSON bytes, its length in ids,
    and each choice's step id and completion ids."""

    prompt: bytes
    count: int
    choices: list[tuple[str, list[int] | None]]

    @property
    def size(self) -> int:
        return len(self.prompt) + 64 + sum(8 * len(c or ()) for _, c in self.choices)


@dataclass(slots=True)
class Encoded:
    """The columns of a step's prompt: the step it refers to (or None), the ids shared with
    that step's prompt + completion, and the packed ids after them."""

    ref: str | None
    shared: int | None
    ids: bytes | None


class Template:
    """The last prompt of vLLM's bytes stored whole, as those bytes and packed: the next
    one stored whole copies the packed ids the two begin with (``_whole``)."""

    __slots__ = ("last", "packed")

    def __init__(self) -> None:
        self.last: Last | None = None
        self.packed = b""


def encode(
    last: Last | None,
    prompt: RawJson | list[int] | None,
    remember: bool = True,
    template: Template | None = None,
) -> tuple[Encoded, Last | None]:
    """The columns for ``prompt`` given the session's ``last`` step, and the ``Last`` this
    prompt makes (its ``choices`` left for the caller to fill; None without ids, or when
    nothing is to be remembered). ``template``: the writer's last prompt stored whole,
    which a prompt stored whole here replaces."""
    if prompt is None:
        return Encoded(None, None, None), None
    if isinstance(prompt, list) and last is None and not remember:
        return Encoded(None, None, _pack(prompt)), None
    data = prompt.data if isinstance(prompt, RawJson) else orjson.dumps(prompt)
    if last is not None:
        found = _shared(last, data)
        if found is not None:
            shared, tail = found
            ref, into = _into_completion(last, shared, tail)
            if shared + into >= MIN_SHARED:
                return Encoded(ref, shared + into, _pack(tail[into:])), Last(
                    data, shared + len(tail), []
                )
    if isinstance(prompt, list):
        return Encoded(None, None, _pack(prompt)), Last(data, len(prompt), [])
    packed = _whole(data, template)
    return Encoded(None, None, packed), Last(data, len(packed) // 4, [])


def _whole(data: bytes, template: Template | None) -> bytes:
    """``data``'s ids packed: those it shares with ``template``'s prompt copied from its
    packed form, the rest parsed; ``template`` then holds ``data``."""
    found = _cut(template.last, data) if template is not None and template.last else None
    if template is not None and found is not None and found[0] >= MIN_SHARED:
        packed = template.packed[: 4 * found[0]] + _pack(_parse_after(data, found[1]))
    else:
        packed = _pack(orjson.loads(data))
    if template is not None:
        template.last, template.packed = Last(data, len(packed) // 4, []), packed
    return packed


def _shared(last: Last, data: bytes) -> tuple[int, list[int]] | None:
    """(ids of ``data`` equal to the last prompt's first ids, the ids after them), or None
    when ``data`` is not a JSON array of ids."""
    found = _cut(last, data)
    return None if found is None else (found[0], _parse_after(data, found[1]))


def _cut(last: Last, data: bytes) -> tuple[int, int] | None:
    """(ids of ``data`` equal to the last prompt's first ids, the position in ``data`` of
    the "," or "]" after them), or None when no whole id is shared."""
    head = last.prompt[:-1]  # without its "]"
    if last.count and data.startswith(head) and data[len(head) : len(head) + 1] in _SEPARATORS:
        return last.count, len(head)
    n = _common_prefix(last.prompt, data)
    a, b = last.prompt[n : n + 1], data[n : n + 1]
    # the id before the first differing byte is whole in both when both end it there
    cut = n if (a in _SEPARATORS and b in _SEPARATORS and n > 1) else data.rfind(b",", 0, n)
    if cut <= 0:
        return None
    return data.count(b",", 0, cut) + 1, cut


def _parse_after(data: bytes, at: int) -> list[int]:
    """The ids after position ``at`` (a "," or the closing "]")."""
    if data[at : at + 1] == b"]":
        return []
    return list(orjson.loads(b"[" + data[at + 1 :]))


def _into_completion(last: Last, shared: int, tail: list[int]) -> tuple[str, int]:
    """The step to refer to, and how many ids of ``tail`` continue its completion: a
    prompt holding the whole last prompt goes on into the answer it continues furthest."""
    best, into = last.choices[0][0], 0
    if shared == last.count:
        for step, completion in last.choices:
            k = 0
            for a, b in zip(tail, completion or (), strict=False):
                if a != b:
                    break
                k += 1
            if k > into:
                best, into = step, k
    return best, into


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``: a binary search over slice
    comparisons (memcmp), not a Python loop over bytes."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _pack(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


class Lasts(OrderedDict[str, Last]):
    """Each session's ``Last``, least recently written first, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.used = 0

    def put(self, sid: str, last: Last) -> None:
        old = self.pop(sid, None)
        if old is not None:
            self.used -= old.size
        self[sid] = last
        self.used += last.size
        while self.used > self.budget and self:
            _, gone = self.popitem(last=False)
            self.used -= gone.size

    def clear(self) -> None:
        super().clear()
        self.used = 0
