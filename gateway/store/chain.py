"""Hashes that link the steps of a session when the client names none.

An agent resends its whole history at every step. A step's *continuation* hash
covers its request's messages plus the answer it got; the next step's *prefix*
hash covers its messages up to and including the last assistant message. When
they are equal the second step continues the first. Two samples of one prompt
get different answers, hence different continuations, and stay apart.

Messages are reduced to what identifies them (role, text, tool calls, tool call
id) because SDKs re-serialize the assistant message they got back (``refusal:
null``, reordered keys, re-dumped JSON arguments).

An agent's step resends the history its last step hashed. With a ``ChainCache`` the
hash of that step's continuation is kept open (SHA-256 is computed front to back, and the
hashed array is its elements' bytes joined), so the next step reduces and hashes only the
messages it adds: the same hashes, at a cost per step that does not grow with the session.
A client that sends back something else than the answer it got (an edited or scripted
assistant message) misses that link; for a named session the cache also keeps the open hash
of the session's last request, without its answer, and a step that resends that request's
messages hashes only what follows them (``ChainCache.last_request``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import orjson


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        texts = (p.get("text") for p in content if isinstance(p, dict))
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def canonical_args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONDecodeError:
            return arguments
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def _canonical(message: Any) -> list[Any]:
    if not isinstance(message, dict):
        return ["?", str(message)]
    calls = [
        [
            (tc.get("function") or {}).get("name"),
            canonical_args((tc.get("function") or {}).get("arguments")),
        ]
        for tc in message.get("tool_calls") or ()
        if isinstance(tc, dict)
    ]
    return [message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id")]


def _digest(canonical: list[list[Any]]) -> str:
    return hashlib.sha256(orjson.dumps(canonical)).hexdigest()


def history_hash(messages: list[Any]) -> str:
    """The definition of every hash here: SHA-256 of the JSON array of the messages'
    canonical forms. ``History`` computes the same bytes piece by piece."""
    return _digest([_canonical(m) for m in messages])


def _part(message: Any) -> bytes:
    """A message's canonical form as it appears in the array ``history_hash`` hashes:
    orjson writes an array as ``[``, its elements' own JSON joined by ``,``, and ``]``."""
    return orjson.dumps(_canonical(message))


def _last_assistant(messages: list[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "assistant":
            return i
    return None


class _Open:
    """A SHA-256 that has taken ``[`` and the canonical forms of ``messages`` (comma
    separated) and is not closed yet: closing it gives their ``history_hash``; extending a
    copy continues the array without hashing the messages again."""

    __slots__ = ("messages", "sha", "size")

    def __init__(self, sha: Any, messages: list[Any], size: int) -> None:
        self.sha, self.messages, self.size = sha, messages, size

    @classmethod
    def start(cls) -> _Open:
        return cls(hashlib.sha256(b"["), [], 1)

    def extended(self, messages: list[Any], parts: list[bytes]) -> _Open:
        if not parts:
            return self
        data = b",".join(parts)
        if self.size > 1:  # something before: every part is at least ``[]``
            data = b"," + data
        sha = self.sha.copy()
        sha.update(data)
        return _Open(sha, self.messages + messages if messages else self.messages,
                     self.size + len(data))  # fmt: skip

    def closed(self) -> str:
        sha = self.sha.copy()
        sha.update(b"]")
        return str(sha.hexdigest())


class History:
    """A request's messages reduced once, for its prefix hash and the continuation hash of
    each of its answers (a request with ``n`` samples has ``n``).

    With a ``ChainCache``, the history up to its last assistant message is looked up among
    the continuations computed before (the previous step of the session, as a rule): when
    found, only the messages after it are reduced and hashed, so a step costs what it
    adds, not the whole history; otherwise the whole history is, as without a cache. The
    hashes are the same either way (``history_hash`` of the same messages)."""

    __slots__ = ("_all", "_cache", "_found", "_head", "_prefix")

    def __init__(
        self, messages: list[Any], cache: ChainCache | None = None, session: str | None = None
    ) -> None:
        """``session``: the named session the request belongs to, if any (with a cache:
        its last request is kept, and found, under that name)."""
        last = _last_assistant(messages)
        cut = 0 if last is None else last + 1
        found = cache.find(messages, last) if cache is not None and last is not None else None
        if found is not None:
            head, rest = found.head, [_part(m) for m in messages[cut:]]
        else:
            base = None
            if cache is not None and session is not None:
                base = cache.last_request(session, messages, cut)
            start = _Open.start() if base is None else base
            done = len(start.messages)
            parts = [_part(m) for m in messages[done:]]
            head = start.extended(messages[done:cut], parts[: cut - done])
            rest = parts[cut - done :]
        self._cache, self._found = cache, found
        self._head = head if last is not None else None
        self._all = head.extended(messages[cut:], rest)
        self._prefix: str | None = None
        if cache is not None and session is not None:
            cache.keep_request(session, self._all)

    def prefix(self) -> str | None:
        """Hash of the history up to the last assistant message; None when there is none."""
        if self._head is not None and self._prefix is None:
            self._prefix = self._head.closed()
        return self._prefix

    def continuation(self, answer: dict[str, Any] | None) -> str | None:
        """Hash of the history followed by ``answer``: the next step's prefix hash."""
        if answer is None:
            return None
        part = _part({"role": "assistant", **answer})
        opened = self._all.extended([], [part])  # the request's messages and the answer's part
        if self._cache is not None:
            self._cache.put(part, opened, self._found)
            self._found = None  # the link it extended is superseded once
        return opened.closed()


class _Found:
    """A cache hit: the open hash through the request's last assistant message, and the
    link it came from."""

    __slots__ = ("head", "key", "link")

    def __init__(self, head: _Open, key: tuple[int, bytes], link: _Open) -> None:
        self.head, self.key, self.link = head, key, link


class ChainCache:
    """Recent continuations as open hashes (``_Open``), found by the answer they end with
    and its position: the next step of a session resends that answer (re-serialized by
    its SDK: compared in canonical form) after the same messages (compared as the values
    they parse to; a validated request holds strings there, where Python's equality is
    JSON's). A link is dropped once a step has extended it, and the least recently used
    go first past ``max_links`` or ``max_mb`` (the hashed bytes a link covers plus
    ``PER_MESSAGE`` a message: about the parsed messages it keeps alive). Not shared
    between threads: one per process that hashes (the writer's, routing's)."""

    PER_MESSAGE = 256
    # links ending in the same answer at the same position: samples of one prompt that
    # answered alike (each sample's session extends a link of its own)
    CANDIDATES = 64

    def __init__(self, max_links: int = 8192, max_mb: float = 64.0) -> None:
        self.max_links = max_links
        self.max_bytes = int(max_mb * 2**20)
        self._links: OrderedDict[tuple[int, bytes], list[_Open]] = OrderedDict()
        self._bytes = self._count = 0
        self.hits = self.misses = 0
        # named session -> the open hash of its last request's messages (no answer)
        self._requests: OrderedDict[str, _Open] = OrderedDict()
        self._request_bytes = 0
        self.request_hits = 0

    def __len__(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def _cost(self, link: _Open) -> int:
        return link.size + self.PER_MESSAGE * len(link.messages)

    def find(self, messages: list[Any], last: int) -> _Found | None:
        """The open hash of ``messages[: last + 1]`` (``last`` its last assistant message)
        when a link covers the same history."""
        key = (last, _part(messages[last]))
        before = messages[:last]
        for link in self._links.get(key, ()):
            if link.messages == before:
                self._links.move_to_end(key)
                self.hits += 1
                # the link's own message objects: one copy of a history for a whole session
                head = _Open(link.sha, [*link.messages, messages[last]], link.size)
                return _Found(head, key, link)
        self.misses += 1
        return None

    def last_request(self, session: str, messages: list[Any], cut: int) -> _Open | None:
        """The open hash of session ``session``'s last request when ``messages`` begin with
        that request's messages (compared as parsed values, as ``find`` does) and no more
        than ``cut`` of them (the history through its last assistant message)."""
        link = self._requests.get(session)
        if link is None:
            return None
        n = len(link.messages)
        if n > cut or messages[:n] != link.messages:
            return None
        self.request_hits += 1
        return link

    def keep_request(self, session: str, link: _Open) -> None:
        """Keep ``link`` (a request's messages, open, no answer) as session ``session``'s
        last request; the least recently used sessions go first past ``max_links`` or
        ``max_mb`` (counted apart from the continuations: the two mostly share their
        message objects)."""
        old = self._requests.pop(session, None)
        if old is not None:
            self._request_bytes -= self._cost(old)
        if self.max_links <= 0 or self.max_bytes <= 0:
            return
        self._requests[session] = link
        self._request_bytes += self._cost(link)
        while self._requests and (
            len(self._requests) > self.max_links or self._request_bytes > self.max_bytes
        ):
            _, gone = self._requests.popitem(last=False)
            self._request_bytes -= self._cost(gone)

    def put(self, part: bytes, link: _Open, found: _Found | None) -> None:
        """Keep ``link`` (a request's messages followed by the answer ``part``, open), in
        place of the link the request's history was found by."""
        if found is not None:
            self._drop(found.key, found.link)
        if self.max_links <= 0 or self.max_bytes <= 0:
            return
        key = (len(link.messages), part)
        links = self._links.setdefault(key, [])
        links.insert(0, link)
        self._links.move_to_end(key)
        self._bytes += self._cost(link)
        self._count += 1
        if len(links) > self.CANDIDATES:
            self._forget(links.pop())
        while self._links and (self._count > self.max_links or self._bytes > self.max_bytes):
            oldest, links = next(iter(self._links.items()))
            self._forget(links.pop())  # that key's oldest link
            if not links:
                del self._links[oldest]

    def _forget(self, link: _Open) -> None:
        self._bytes -= self._cost(link)
        self._count -= 1

    def _drop(self, key: tuple[int, bytes], link: _Open) -> None:
        links = self._links.get(key)
        if links is None or link not in links:
            return
        links.remove(link)
        self._forget(link)
        if not links:
            del self._links[key]


def prefix_hash(messages: Any) -> str | None:
    """Hash of the history up to the last assistant message; None when there is none."""
    return History(messages).prefix() if isinstance(messages, list) else None


def continuation_hash(messages: Any, answer: dict[str, Any] | None) -> str | None:
    if not isinstance(messages, list):
        return None
    return History(messages).continuation(answer)
