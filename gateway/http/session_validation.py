"""Validating an agent's chat requests without validating its history again at every step.

An agent resends its whole conversation at every step: step 15 of a tool loop carries the
29 messages of step 14, already validated, and one tool call and its result more. For a
named session (tenant and ``X-Session-Id`` or ``user``) this remembers the messages and
tools of its last valid request. When the next request's messages start with exactly
those (``==``: equal JSON values, not a hash that might collide) and it offers the same
tools, only the new messages are validated, with the rest of the body as sent.

The answer is the same as validating the whole body: every message and tool is validated
on its own (``ChatMessage``, ``Tool``; no validator looks across them), so a body is valid
exactly when its other fields, each message and each tool are. A request that fails is
validated again whole, so that the 400 names the same parameter (``messages.17.content``).

Memory is bounded: at most ``max_sessions`` sessions and ``max_bytes`` of request bodies
(their JSON size) are remembered, the least recently used forgotten first. A session
that changed its history is simply validated whole and remembered anew.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gateway.errors import InvalidRequest
from gateway.http.body import validated

# A miss costs one whole validation; what is kept stays alive as Python objects (about 1.5x
# its JSON for an agent's text) that the collector's full passes walk: kept small.
MAX_SESSIONS = 1024
MAX_BYTES = 32 * 2**20


@dataclass(frozen=True, slots=True)
class _Known:
    messages: list[Any]  # the last valid request's messages (its parsed objects)
    tools: object  # and its tools (None: none offered)
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
        model: type[BaseModel],
        session: tuple[str, str] | None,
        size: int,
    ) -> None:
        """Validate ``body`` as ``model`` (a 400 naming the parameter otherwise);
        ``session``: (tenant, session id) of a named chat session, else None; ``size``:
        the body's JSON bytes."""
        messages = body.get("messages")
        if session is None or not isinstance(messages, list) or not messages:
            validated(body, model)
            return
        known = self._known.get(session)
        shared = _shared(known, messages, body.get("tools")) if known is not None else 0
        if shared:
            probe = dict(body)
            # the new messages; a resent request has none: its last one (valid) stands in
            probe["messages"] = messages[shared:] or messages[-1:]
            probe.pop("tools", None)  # the same as the known request's, valid
            try:
                validated(probe, model)
                self.skipped += shared
            except InvalidRequest:  # the whole body's error, naming the message's index
                validated(body, model)
        else:
            validated(body, model)
        self._remember(session, _Known(messages, body.get("tools"), size))

    def _remember(self, session: tuple[str, str], known: _Known) -> None:
        old = self._known.pop(session, None)
        if old is not None:
            self._bytes -= old.size
        if known.size > self.max_bytes:
            return
        self._known[session] = known
        self._bytes += known.size
        while len(self._known) > self.max_sessions or self._bytes > self.max_bytes:
            _, gone = self._known.popitem(last=False)
            self._bytes -= gone.size


def _shared(known: _Known, messages: list[Any], tools: object) -> int:
    """How many of ``messages`` the known request validated: all of its messages when
    ``messages`` starts with them and the tools are the same; else 0."""
    count = len(known.messages)
    if count > len(messages) or tools != known.tools:
        return 0
    return count if messages[:count] == known.messages else 0
