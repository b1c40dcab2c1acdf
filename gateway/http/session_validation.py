"""Validating an agent's chat requests without validating its history again at every step.

An agent resends its whole conversation at every step: step 15 of a tool loop carries the
29 messages of step 14, already validated, and one tool call and its result more. For a
named session (tenant and ``X-Session-Id`` or ``user``) this remembers the messages and
tools of its last valid request, as ``orjson.dumps`` writes them. When the next request's
messages, written the same way, start with exactly those bytes (not a hash that might
collide) and it offers the same tools, only the new messages are validated, with the rest
of the body as sent.

The bytes compared are the ones the upstream payload embeds (``Encoded``, handed on in
``ParsedRequest.encoded``): one serialization of the history serves the check and the
payload, where an ``==`` walk over the remembered objects and a second serialization of
the whole body did. Equal bytes mean identical JSON values (orjson writes every value one
way: ``1``, ``1.0`` and ``true`` apart, keys in their order), a stricter test than
``==``, so a prefix skipped here is one ``==`` skipped too.

The answer is the same as validating the whole body: every message and tool is validated
on its own (``ChatMessage``, ``Tool``; no validator looks across them), so a body is valid
exactly when its other fields, each message and each tool are. A request that fails is
validated again whole, so that the 400 names the same parameter (``messages.17.content``).

Memory is bounded: at most ``max_sessions`` sessions and ``max_bytes`` of request bodies
(their JSON size) are remembered, the least recently used forgotten first. A session
that changed its history is simply validated whole and remembered anew. What is kept is
bytes, which the collector does not walk. A body orjson cannot write (nested deeper than
its 254 levels) is validated whole and not remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
from pydantic import TypeAdapter

from gateway.errors import InvalidRequest
from gateway.http.body import checked

# ``orjson.dumps`` of some fields of a request body, by name: written once, here, and
# embedded as they are in the upstream payload (``gateway.pipeline.upstream_body``)
Encoded = Mapping[str, bytes]
NONE: Encoded = MappingProxyType({})

# A miss costs one whole validation; what is kept is the history's JSON bytes.
MAX_SESSIONS = 1024
MAX_BYTES = 32 * 2**20


@dataclass(frozen=True, slots=True)
class _Known:
    messages: bytes  # the last valid request's messages as orjson writes them
    count: int  # how many
    tools: bytes | None  # and its tools (None: no ``tools`` key)
    size: int  # its body's JSON bytes, what the bound counts


class SessionValidator:
    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()
        self._bytes = 0
        self.skipped = 0  # messages not validated again, for tests and figures

    def __len__(self) -> int:
        return len(self._known)

    @property
    def bytes(self) -> int:
        return self._bytes

    def validate(
        self,
        body: dict[str, Any],
        shape: TypeAdapter[Any],
        session: tuple[str, str] | None,
        size: int,
    ) -> Encoded:
        """Validate ``body`` as ``shape`` (a 400 naming the parameter otherwise);
        ``session``: (tenant, session id) of a named chat session, else None; ``size``:
        the body's JSON bytes. Returns the fields it serialized (none for a request that
        is not a named chat session's)."""
        messages = body.get("messages")
        if session is None or not isinstance(messages, list) or not messages:
            checked(body, shape)
            return NONE
        try:
            encoded = {"messages": orjson.dumps(messages)}
            if "tools" in body:
                encoded["tools"] = orjson.dumps(body["tools"])
        except orjson.JSONEncodeError:  # deeper than orjson writes: the payload fails later
            checked(body, shape)
            self._forget(session)
            return NONE
        known = self._known.get(session)
        shared = _shared(known, encoded, len(messages)) if known is not None else 0
        if shared:
            probe = dict(body)
            # the new messages; a resent request has none: its last one (valid) stands in
            probe["messages"] = messages[shared:] or messages[-1:]
            probe.pop("tools", None)  # the same as the known request's, valid
            try:
                checked(probe, shape)
                self.skipped += shared
            except InvalidRequest:  # the whole body's error, naming the message's index
                checked(body, shape)
        else:
            checked(body, shape)
        known = _Known(encoded["messages"], len(messages), encoded.get("tools"), size)
        self._remember(session, known)
        return encoded

    def _forget(self, session: tuple[str, str]) -> None:
        old = self._known.pop(session, None)
        if old is not None:
            self._bytes -= old.size

    def _remember(self, session: tuple[str, str], known: _Known) -> None:
        self._forget(session)
        if known.size > self.max_bytes:
            return
        self._known[session] = known
        self._bytes += known.size
        while len(self._known) > self.max_sessions or self._bytes > self.max_bytes:
            _, gone = self._known.popitem(last=False)
            self._bytes -= gone.size


def _shared(known: _Known, encoded: Encoded, count: int) -> int:
    """How many of the request's ``count`` messages the known request validated: all of
    its messages when the request's start with them and the tools are the same; else 0.

    Exact on bytes: a JSON object's text ends where its braces balance (the known
    messages are objects: they were valid), so when the request's array starts with the
    known array's bytes but its ``]``, its first ``known.count`` elements are those
    objects, written alike: identical values."""
    if known.count > count or encoded.get("tools") != known.tools:
        return 0
    prefix = memoryview(known.messages)[:-1]  # "[" and the messages, without a copy
    return known.count if encoded["messages"].startswith(prefix) else 0
