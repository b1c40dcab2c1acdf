"""A chat answer's prompt token ids, cut out of its bytes before the answer is parsed.

Recording asks vLLM for ``prompt_token_ids``: for an agent 14 tool calls into its task,
about 10,000 integers in every answer. Parsed, they are a list of 10,000 Python ints
that only the writer process needs; parsing them took longer than the rest of the
answer and, kept until the record was written, they were what the collector walked in
its longest pauses (docs/decisions/gc-freeze.md). So the gateway takes the array's
bytes out of the answer as they are, puts ``null`` in their place (what vLLM writes for
a client that did not ask for them), and hands the bytes to the recorder unparsed.

Why a byte search is exact here: inside a JSON string every ``"`` is escaped, so the
bytes ``"prompt_token_ids":`` occur only as a real key; a chat answer has that key once,
at the top (a choice's own ids are ``token_ids``). Whatever is not a plain array of
integers is left alone: the caller then parses the answer as it is.
"""

from __future__ import annotations

import orjson

from gateway.recording.records import RawJson

KEY = b'"prompt_token_ids":'
_SPACE = b" \t\r\n"
_INTEGERS = b"0123456789-," + _SPACE


class PromptIds(RawJson):
    """A prompt's ids as cut here: a JSON array of digits, ``-`` and ``,`` (spaces allowed),
    kept between two quotes (one copy out of the answer, as before) so that the recorder's
    frame carries it as a JSON string without another copy
    (``gateway.recording.writer_process.encode_step``)."""

    __slots__ = ("quoted",)

    def __init__(self, quoted: bytes) -> None:  # the array's bytes between two quotes
        self.quoted = quoted

    @property
    def data(self) -> bytes:  # type: ignore[override]
        return self.quoted[1:-1]


_PLAIN = b"0123456789-, "  # no line breaks or tabs: may stand inside a JSON string


def cut_prompt_ids(raw: bytes) -> tuple[bytes, RawJson | None]:
    """``raw`` with its ``prompt_token_ids`` array replaced by ``null``, and the array's
    bytes; ``(raw, None)`` when there is no such array."""
    at = raw.find(KEY)
    if at < 0:
        return raw, None
    start = at + len(KEY)
    while start < len(raw) and raw[start] in _SPACE:
        start += 1
    if raw[start : start + 1] != b"[":
        return raw, None  # null, or not an array
    end = raw.find(b"]", start)
    if end < 0:
        return raw, None
    rest = raw[:start] + b"null" + raw[end + 1 :]
    if not raw[start + 1 : end].translate(None, _PLAIN):
        return rest, PromptIds(b"".join((b'"', memoryview(raw)[start : end + 1], b'"')))
    if raw[start + 1 : end].translate(None, _INTEGERS):
        return raw, None  # not integers only (nested arrays, strings): not ours to cut
    return rest, RawJson(raw[start : end + 1])


def as_written(value: object) -> orjson.Fragment:
    """orjson's ``default``: a ``RawJson`` goes out as the bytes it came in."""
    if isinstance(value, RawJson):
        return orjson.Fragment(value.data)
    raise TypeError(f"{type(value).__name__} is not JSON")
