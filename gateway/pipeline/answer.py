"""The answer stage: what the client gets of a whole upstream answer, and what it tells.

A 200 answer is parsed once: usage, finish reasons and the served model for the outcome;
the choices' token ids and log-probabilities for the recorder (then removed unless the
client asked for them); the engine's KV-compaction record for the recorder (always removed:
docs/decisions/kv-record-stripped.md); the assistant messages for an unnamed session's hash
chain. An error that is not in the OpenAI shape is wrapped into it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.pipeline.outcome import Captured
from gateway.recording import capture
from gateway.recording.capture import StreamCapture, Wants
from gateway.recording.cut import as_written, cut_prompt_ids
from gateway.recording.records import RawJson
from gateway.upstream.dispatch import Completed, upstream_message
from gateway.upstream.relay_filter import take_kv_record
from router import Endpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes  # what the client gets
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()
    model: str | None = None
    captured: Captured | None = None
    answers: tuple[Any, ...] | None = None
    error: str | None = None


def parsed_body(result: Completed, endpoint: Endpoint) -> dict[str, Any] | None:
    """The answer as a JSON object, parsed once (``result.data`` keeps it). A chat answer's
    prompt token ids are not parsed: cut out first (``gateway.recording.cut``), they are
    the object's ``prompt_token_ids`` as ``RawJson``, for the recorder."""
    if result.data is None:
        raw, cut = cut_prompt_ids(result.body) if endpoint == "chat" else (result.body, None)
        try:
            result.data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if cut is not None and isinstance(result.data, dict):
            result.data["prompt_token_ids"] = cut
    return result.data if isinstance(result.data, dict) else None


def answer(
    result: Completed, endpoint: Endpoint, wants: Wants | None, chain: bool, request_id: str
) -> Answer:
    """``wants``: recording captured this answer; ``chain``: keep its messages for the chain."""
    if result.status != 200:
        body = result.body if _is_openai_error(result.body) else _wrap_error(result)
        return Answer(result.status, body, error=upstream_message(result.body))
    data = parsed_body(result, endpoint)
    if data is None:
        log.warning(
            "request %s: upstream answered 200 with a body that is not a JSON object", request_id
        )
        return Answer(200, result.body)
    listed = data.get("choices")
    choices = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    model = data.get("model") if isinstance(data.get("model"), str) else None
    captured = None
    kv_record = take_kv_record(data)  # the engine compacted its KV cache: not the client's
    changed = kv_record is not None
    if wants is not None:
        captured = Captured(
            _prompt_ids(data, choices), capture.choices_of(data, endpoint), model, kv_record
        )
        if not (wants.logprobs and wants.token_ids):
            capture.strip(data, wants)  # cut ids the client did not ask for
            changed = True
    body = orjson.dumps(data, default=as_written) if changed else result.body
    return Answer(
        200, body, _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")),
        tuple(c.get("finish_reason") or "" for c in choices), model, captured,
        tuple(c.get("message") for c in choices) if chain else None,
    )  # fmt: skip


def _prompt_ids(data: dict[str, Any], choices: list[dict[str, Any]]) -> list[int] | RawJson | None:
    """The prompt's token ids: at the top of a chat answer, in each choice of a completion
    (a batch of prompts has one set per prompt; the step records the first)."""
    ids = data.get("prompt_token_ids")
    if ids is None and choices:
        ids = choices[0].get("prompt_token_ids")
    return ids if isinstance(ids, list | RawJson) else None


def stream_capture(endpoint: Endpoint, wants: Wants | None, chain: bool) -> StreamCapture | None:
    """What reads a stream's events on their way out: recording's capture (which removes
    what the client did not ask for), or, for an unnamed session's chain alone, an
    assembler that leaves the events as they are."""
    if wants is not None:
        return StreamCapture(endpoint, wants)
    return StreamCapture(endpoint, Wants(logprobs=True, token_ids=True)) if chain else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_openai_error(raw: bytes) -> bool:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict)


def _wrap_error(result: Completed) -> bytes:
    err = InvalidRequest(f"upstream: {upstream_message(result.body)}", status=result.status)
    return orjson.dumps(err.body())
