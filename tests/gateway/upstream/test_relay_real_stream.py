"""A compacting vLLM's real stream through the relay's filter and recording's capture.

``data/`` holds two streams captured from vLLM 0.32 with kvplugin compacting (a 308-token
prompt kept to 154, ``max_tokens: 8``): one answering the body the gateway sends for a
recorded stream (``stream_options.include_usage``, ``return_token_ids``, ``logprobs``:
a chunk per token, the usage chunk, then the plugin's record chunk before ``[DONE]``), and
one answering the client's own body (what vLLM sends a client directly; with the record
chunk too). The client's events must be the second stream's, minus the record chunk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.recording.capture import StreamCapture, prepare
from gateway.upstream.relay_filter import EventFilter
from gateway.upstream.sse import DONE, split_events

DATA = Path(__file__).parent / "data"
GATEWAY_STREAM = (DATA / "vllm_compacted_gateway_stream.sse").read_bytes()
PLAIN_STREAM = (DATA / "vllm_compacted_plain_stream.sse").read_bytes()
RECORD = {"prompt_tokens": 308, "kept_tokens": 154, "evicted_tokens": 154, "freed_blocks": 1}
VARYING = ("id", "created")  # per request


def events(stream: bytes) -> list[bytes]:
    found, rest = split_events(stream)
    assert not rest
    return found


def relayed(groups: list[list[bytes]]) -> tuple[list[bytes], EventFilter]:
    """The client's events when the upstream events arrive in ``groups``."""
    capture = StreamCapture("chat", prepare("chat", {"stream": True}))
    f = EventFilter(strip_usage=True, rewrite=capture.on_event)
    out = b"".join(f(group) for group in groups)
    return events(out), f


def shape(ev: bytes) -> dict[str, Any]:
    """An event's object without what differs between requests, its choices' text apart."""
    data = orjson.loads(ev[6:])
    for key in VARYING:
        data.pop(key)
    for c in data["choices"]:
        c["delta"].pop("content", None)
    return data


def as_in(ev: bytes, other: bytes) -> bytes:
    """``ev`` with ``other``'s id and creation time, its bytes otherwise kept."""
    mine, theirs = orjson.loads(ev[6:]), orjson.loads(other[6:])
    for key in VARYING:
        ev = ev.replace(orjson.dumps(mine[key]), orjson.dumps(theirs[key]), 1)
    return ev


def text(evs: list[bytes]) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for ev in evs if ev != DONE
        for c in orjson.loads(ev[6:])["choices"]
    )  # fmt: skip


def groupings() -> list[list[list[bytes]]]:
    evs = events(GATEWAY_STREAM)
    return [
        [evs],  # all in one read
        [[ev] for ev in evs],  # one read each
        [evs[:-3], evs[-3:]],  # the usage chunk, the record chunk and [DONE] together
        [evs[:-2], evs[-2:-1], evs[-1:]],  # the usage chunk closes a read
    ]


@pytest.mark.parametrize("groups", groupings(), ids=["one", "each", "tail3", "split"])
def test_the_client_gets_vllms_own_events_without_the_record_chunk(groups):
    out, f = relayed(groups)
    plain = [ev for ev in events(PLAIN_STREAM) if b'"kv_transfer_params"' not in ev]
    assert out[-1] == DONE and out.count(DONE) == 1
    assert all(orjson.loads(ev[6:])["choices"] for ev in out[:-1])  # no usage, no record
    assert b"kv_transfer_params" not in b"".join(out) and b'"usage"' not in b"".join(out)
    # the first chunk as vLLM writes it for this client (its null prompt ids and text),
    # the others shaped as vLLM's (vLLM groups tokens per chunk differently without logprobs)
    assert as_in(out[0], plain[0]) == plain[0]
    assert {orjson.dumps(shape(ev)) for ev in out[1:-2]} == {
        orjson.dumps(shape(ev)) for ev in plain[1:-2]
    }
    assert shape(out[-2]) == shape(plain[-2])  # the finishing chunk, vLLM's fingerprint
    assert text(out) == text(plain) == "2022-01-"
    assert f.kv_compaction is not None
    assert {k: f.kv_compaction[k] for k in RECORD} == RECORD
    assert f.usage == {"prompt_tokens": 308, "total_tokens": 316, "completion_tokens": 8}


def test_a_read_cut_inside_the_record_chunk_still_strips_it():
    cut = GATEWAY_STREAM.index(b'"kv_transfer_params"') + 5
    out, buf = [], b""
    capture = StreamCapture("chat", prepare("chat", {"stream": True}))
    f = EventFilter(strip_usage=True, rewrite=capture.on_event)
    for part in (GATEWAY_STREAM[:cut], GATEWAY_STREAM[cut:]):
        evs, buf = split_events(buf + part)
        out.append(f(evs))
    assert not buf and b"kv_transfer_params" not in b"".join(out)
    assert b"".join(out).endswith(b'"system_fingerprint":"vllm-0.32.0-cd2787a5"}\n\n' + DONE)
    assert f.kv_compaction is not None and f.kv_compaction["kept_tokens"] == 154
