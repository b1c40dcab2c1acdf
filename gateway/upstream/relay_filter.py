"""What the stream relay does to each upstream event before the client sees it.

The gateway asks a stream for more than the client did; this takes the additions out again
and keeps what they carried, so that the client's events are the ones vLLM would have sent
it directly:

* **The usage chunk** the gateway asked for (``strip_usage``; ``choices: []``): its counts
  are kept, the chunk is dropped. vLLM stamps ``system_fingerprint`` on that chunk when
  usage is asked for, and on each finishing chunk (one with a ``finish_reason``) when it is
  not; so while the usage chunk is the gateway's, finishing chunks are held back until it
  arrives and go out stamped with its fingerprint, as vLLM would have sent them. They are
  the last events of their choice, so only their own write is delayed (with ``n > 1``, a
  choice that finishes early has its last event sent when the usage chunk comes, after the
  other choices' events; each choice's events keep their order).
* **kvplugin's record chunk** (``choices: []`` with ``kv_transfer_params``, sent before
  ``[DONE]`` by a compacting engine, kvplugin/stream.py): its compaction record is kept and
  the chunk is never forwarded.

Events then pass through an optional ``rewrite`` (recording's capture).

A whole (non-streamed) answer carries the record in vLLM's own ``kv_transfer_params``
field; ``take_kv_record`` takes it out the same way, so that streamed or not, the client
gets what vLLM would have sent for an uncompacted request (docs/decisions/kv-record-stripped.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import orjson

from gateway.upstream.sse import DONE
from kvplugin.metrics import RESULT_KEY, record_of

USAGE_MARK = b'"usage":{'
EMPTY_CHOICES = b'"choices":[]'
KV_MARK = b'"kv_transfer_params":{'
# a string value can hold these bytes only escaped, so they mark a key of the chunk
FINISH_MARK = b'"finish_reason":"'
FINGERPRINT_MARK = b'"system_fingerprint":'
# top-level keys vLLM writes after system_fingerprint (ChatCompletionStreamResponse,
# CompletionStreamResponse): a chunk holding one is rebuilt instead of appended to
AFTER_FINGERPRINT = ("prompt_token_ids", "prompt_text", "metrics")
PROMPT_IDS = b'"prompt_token_ids":['
LONG_EVENT = 4096  # bytes; a shorter event is searched whole


class EventFilter:
    """Feed it the stream's events in order; it returns the bytes for the client."""

    def __init__(
        self, *, strip_usage: bool, rewrite: Callable[[bytes], bytes] | None = None
    ) -> None:
        self._strip_usage = strip_usage
        self._rewrite = rewrite
        self._held: list[bytes] = []  # finishing chunks waiting for the usage chunk
        self.saw_done = False
        self.usage: dict[str, Any] = {}
        self.kv_compaction: dict[str, Any] | None = None

    def __call__(self, events: list[bytes]) -> bytes:
        out: list[bytes] = []
        for ev in events:
            keys = Keys(ev) if len(ev) > LONG_EVENT else ev
            if ev == DONE:
                self.saw_done = True
                out += self._release(None)
                out.append(ev)
            elif KV_MARK in keys and EMPTY_CHOICES in keys and self._note_kv(ev):
                continue  # the engine's note to the gateway
            elif USAGE_MARK in keys and self._usage_chunk(ev, out):
                continue
            elif self._strip_usage and FINISH_MARK in keys and FINGERPRINT_MARK not in keys:
                self._held.append(ev)
            else:
                out.append(self._out(ev))
        return b"".join(out)

    def flush(self) -> bytes:
        """What is still held, unstamped (the stream failed before its usage chunk)."""
        return b"".join(self._release(None))

    def _usage_chunk(self, ev: bytes, out: list[bytes]) -> bool:
        """Note a usage chunk's counts; True when it is the gateway's and dropped."""
        data = _object(ev)
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if not (self._strip_usage and EMPTY_CHOICES in ev):
            return False
        fingerprint = data.get("system_fingerprint")
        out += self._release(fingerprint if isinstance(fingerprint, str) else None)
        return True

    def _note_kv(self, ev: bytes) -> bool:
        record = record_of(_object(ev).get("kv_transfer_params"))
        if record is not None:
            self.kv_compaction = record
        return record is not None

    def _release(self, fingerprint: str | None) -> list[bytes]:
        held, self._held = self._held, []
        if fingerprint is not None:
            held = [stamped(ev, fingerprint) for ev in held]
        return [self._out(ev) for ev in held]

    def _out(self, ev: bytes) -> bytes:
        return ev if self._rewrite is None else self._rewrite(ev)


class Keys:
    """``mark in Keys(ev)`` is ``mark in ev`` for the marks above, without searching the
    prompt's token ids: they make the first event of a recorded stream tens of kilobytes,
    each mark's search 10-20 µs. Why it is exact: every mark starts with a quote, and the
    ids' bytes, when they hold none, can neither hold nor end one (an occurrence that began
    before them would begin with the bytes in front of them, ``"prompt_token_ids":[``)."""

    __slots__ = ("_ev", "_resume", "_skip")

    def __init__(self, ev: bytes) -> None:
        self._ev = ev
        self._skip = self._resume = len(ev)
        at = ev.find(PROMPT_IDS)
        if at >= 0:
            start = at + len(PROMPT_IDS)
            end = ev.find(b"]", start)
            if end >= 0 and ev.find(b'"', start, end) < 0:
                self._skip, self._resume = start, end

    def __contains__(self, mark: bytes) -> bool:
        ev = self._ev
        return ev.find(mark, 0, self._skip) >= 0 or ev.find(mark, self._resume) >= 0


def take_kv_record(data: dict[str, Any]) -> dict[str, Any] | None:
    """The compaction record of a whole answer, removed from it: its ``kv_transfer_params``
    keeps any other key, and is null, as vLLM writes it, when nothing else is left."""
    params = data.get("kv_transfer_params")
    record = record_of(params)
    if record is None or not isinstance(params, dict):
        return None
    rest = {k: v for k, v in params.items() if k != RESULT_KEY}
    data["kv_transfer_params"] = rest or None
    return record


def stamped(ev: bytes, fingerprint: str) -> bytes:
    """``ev`` with ``system_fingerprint`` where vLLM's serializer puts it: after the choices
    and usage, before the keys of ``AFTER_FINGERPRINT``."""
    data = _object(ev)
    if not data or not ev.endswith(b"}\n\n"):
        return ev
    value = orjson.dumps(fingerprint)
    if not any(k in data for k in AFTER_FINGERPRINT):  # vLLM's case: append, bytes kept
        return ev[:-3] + b',"system_fingerprint":' + value + b"}\n\n"
    rebuilt: dict[str, Any] = {}
    for key, item in data.items():
        if key in AFTER_FINGERPRINT and "system_fingerprint" not in rebuilt:
            rebuilt["system_fingerprint"] = fingerprint
        rebuilt[key] = item
    return b"data: " + orjson.dumps(rebuilt) + b"\n\n"


def _object(ev: bytes) -> dict[str, Any]:
    """The event's JSON object; empty when it is not one."""
    with contextlib.suppress(orjson.JSONDecodeError):
        data = orjson.loads(ev[5:])
        if isinstance(data, dict):
            return data
    return {}
