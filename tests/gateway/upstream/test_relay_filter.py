"""EventFilter: what the gateway added to a stream is taken out again, and kept.

Events are written as vLLM 0.32 writes them (pydantic's compact JSON, fields in model
order), so the expected bytes are what vLLM sends a client that asked for nothing extra.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.upstream.relay_filter import EventFilter, stamped, take_kv_record
from gateway.upstream.sse import DONE

FP = "fp_4c1e2d"
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}
RECORD = {"prompt_tokens": 3000, "kept_tokens": 1500, "freed_blocks": 12, "seconds": 0.2,
          "recomputed": False, "evicted_tokens": 1500}  # fmt: skip


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def delta(text: str, index: int = 0, finish: str | None = None, **top: Any) -> bytes:
    choice = {"index": index, "delta": {"content": text}, "logprobs": None,
              "finish_reason": finish}  # fmt: skip
    return event({**HEAD, "choices": [choice], **top})


def usage(fingerprint: str | None = FP) -> bytes:
    counts = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    chunk: dict[str, Any] = {**HEAD, "choices": [], "usage": counts}
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    return event(chunk)


def kv_chunk(record: dict[str, Any] | None = RECORD) -> bytes:
    params = {"gearshift_kv_compaction": record} if record is not None else {"other": 1}
    return event({**HEAD, "choices": [], "kv_transfer_params": params})


def test_the_finishing_chunk_gets_the_fingerprint_of_the_dropped_usage_chunk():
    f = EventFilter(strip_usage=True)
    out = f([delta("a"), delta("b", finish="stop")])
    assert out == delta("a")  # the finishing chunk waits for the usage chunk
    out += f([usage(), DONE])
    # byte for byte what vLLM sends without include_usage
    assert out == delta("a") + delta("b", finish="stop", system_fingerprint=FP) + DONE
    assert f.usage["prompt_tokens"] == 9 and f.saw_done


def test_each_finishing_choice_is_stamped_and_keeps_its_order():
    f = EventFilter(strip_usage=True)
    out = f([delta("a", 0, "stop"), delta("x", 1), delta("y", 1, "length"), usage(), DONE])
    assert out == (
        delta("x", 1)
        + delta("a", 0, "stop", system_fingerprint=FP)
        + delta("y", 1, "length", system_fingerprint=FP)
        + DONE
    )


def test_usage_the_client_asked_for_keeps_vllms_own_placement():
    f = EventFilter(strip_usage=False)
    events = [delta("b", finish="stop"), usage(), DONE]
    assert f(events) == b"".join(events)


def test_a_usage_chunk_without_fingerprint_releases_the_chunks_unchanged():
    f = EventFilter(strip_usage=True)
    assert f([delta("b", finish="stop"), usage(None), DONE]) == delta("b", finish="stop") + DONE


def test_held_chunks_are_flushed_unstamped_when_the_stream_fails():
    f = EventFilter(strip_usage=True)
    assert f([delta("b", finish="stop")]) == b""
    assert f.flush() == delta("b", finish="stop")
    assert f.flush() == b""


def test_finish_reason_inside_content_is_not_a_finishing_chunk():
    f = EventFilter(strip_usage=True)
    tricky = delta('"finish_reason":"stop"')  # escaped inside the string
    assert f([tricky]) == tricky


def test_the_kv_record_chunk_is_read_and_never_forwarded():
    f = EventFilter(strip_usage=True)
    out = f([delta("b", finish="stop"), usage(), kv_chunk(), DONE])
    assert out == delta("b", finish="stop", system_fingerprint=FP) + DONE
    assert f.kv_compaction == RECORD


def test_the_kv_record_chunk_is_stripped_even_when_usage_is_the_clients():
    f = EventFilter(strip_usage=False)
    assert f([usage(), kv_chunk(), DONE]) == usage() + DONE
    assert f.kv_compaction == RECORD


def test_kv_transfer_params_without_a_record_pass_through():
    f = EventFilter(strip_usage=True)
    other = kv_chunk(None)
    assert f([other]) == other and f.kv_compaction is None


def test_rewrite_sees_the_stamped_chunk_and_not_the_dropped_ones():
    seen: list[bytes] = []

    def rewrite(ev: bytes) -> bytes:
        seen.append(ev)
        return ev

    f = EventFilter(strip_usage=True, rewrite=rewrite)
    f([delta("a"), delta("b", finish="stop"), usage(), kv_chunk(), DONE])
    assert seen == [delta("a"), delta("b", finish="stop", system_fingerprint=FP)]


def test_a_chunk_with_keys_after_the_fingerprint_is_rebuilt_in_vllms_order():
    ev = delta("b", finish="stop", prompt_token_ids=[1, 2])
    data = orjson.loads(stamped(ev, FP)[6:])
    assert list(data)[-2:] == ["system_fingerprint", "prompt_token_ids"]
    assert data["system_fingerprint"] == FP and data["choices"][0]["finish_reason"] == "stop"


def test_an_event_that_is_not_a_json_object_is_not_stamped():
    assert stamped(b"data: [1]\n\n", FP) == b"data: [1]\n\n"


def test_a_whole_answer_loses_the_record_and_keeps_the_rest() -> None:
    """As vLLM writes it for an uncompacted request (null), other keys of the field kept."""
    data: dict[str, Any] = {"id": "c", "kv_transfer_params": {"gearshift_kv_compaction": RECORD}}
    assert take_kv_record(data) == RECORD
    assert data == {"id": "c", "kv_transfer_params": None}
    other = {"remote_block_ids": [1, 2], "gearshift_kv_compaction": RECORD}
    data = {"kv_transfer_params": other}
    assert take_kv_record(data) == RECORD
    assert data == {"kv_transfer_params": {"remote_block_ids": [1, 2]}}
    for untouched in ({}, {"kv_transfer_params": None}, {"kv_transfer_params": {"x": 1}},
                      {"kv_transfer_params": {"gearshift_kv_compaction": "junk"}}):  # fmt: skip
        before = orjson.dumps(untouched)
        assert take_kv_record(untouched) is None and orjson.dumps(untouched) == before
