"""A step served from a compacted KV cache says so, and its client never sees the engine's
record: not its chunk in a stream (kvplugin/stream.py sends it before ``[DONE]``; the relay
strips it), nor its ``kv_transfer_params`` in a whole answer (docs/decisions/kv-record-stripped.md)."""

from __future__ import annotations

import httpx

from tests.integration.conftest import Stack
from tests.support.fake_upstream import Behaviour, FakeUpstream

RECORD = {"prompt_tokens": 3000, "kept_tokens": 1500, "evicted_tokens": 1500,
          "freed_blocks": 46, "seconds": 0.2, "recomputed": False}  # fmt: skip
# the machine is shared: httpx's default 5 s was seen to run out under load
TIMEOUT_S = 60
BODY = {"model": "full", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def streamed_step(stack: Stack) -> tuple[bytes, dict]:
    with httpx.stream(
        "POST", stack.url + "/v1/chat/completions", json=BODY, timeout=TIMEOUT_S
    ) as r:
        step_id = r.headers["x-gearshift-step-id"]
        body = b"".join(r.iter_bytes())
    step = httpx.get(stack.url + "/v1/steps/" + step_id, timeout=TIMEOUT_S)
    assert step.status_code == 200, step.text
    return body, step.json()


def test_a_compacted_stream_records_what_was_kept(make_stack) -> None:
    stack = make_stack([FakeUpstream().then(Behaviour(kv_record=RECORD))])
    body, step = streamed_step(stack)
    assert b"kv_transfer_params" not in body and b'"choices":[]' not in body
    assert body.endswith(b"data: [DONE]\n\n")
    assert step["response"]["content"] == "tok0 tok1 tok2 tok3 tok4 "
    assert {k: v for k, v in step["features"].items() if k.startswith("kv_")} == {
        "kv_compaction_prompt_tokens": 3000.0, "kv_compaction_kept_tokens": 1500.0,
        "kv_compaction_evicted_tokens": 1500.0, "kv_compaction_freed_blocks": 46.0,
    }  # fmt: skip


def test_a_stream_without_a_record_records_no_compaction(make_stack) -> None:
    _, step = streamed_step(make_stack([FakeUpstream()]))
    assert not any(k.startswith("kv_") for k in step["features"] or {})


def test_a_compacted_answer_records_what_was_kept_and_its_client_sees_null(make_stack) -> None:
    stack = make_stack([FakeUpstream().then(Behaviour(kv_record=RECORD))])
    r = httpx.post(
        stack.url + "/v1/chat/completions", json={**BODY, "stream": False}, timeout=TIMEOUT_S
    )
    assert r.status_code == 200, r.text
    assert r.json()["kv_transfer_params"] is None  # as vLLM answers an uncompacted request
    assert b"gearshift_kv_compaction" not in r.content
    step = httpx.get(stack.url + "/v1/steps/" + r.headers["x-gearshift-step-id"], timeout=60)
    assert step.json()["features"]["kv_compaction_kept_tokens"] == 1500.0
