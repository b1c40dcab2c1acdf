"""A step served from a compacted KV cache says so: the engine's record (kvplugin, in the
answer's ``kv_transfer_params``) is captured and lands in the step's features."""

from __future__ import annotations

import orjson

from gateway.pipeline.answer import answer
from gateway.pipeline.outcome import Outcome, Served
from gateway.pipeline.record import plan_step, step_record
from gateway.pipeline.route import Routing
from gateway.recording.capture import Wants
from gateway.routing.sessions import SessionKeys
from router import Decision, Tier
from tests.gateway.pipeline.conftest import parsed
from tests.gateway.pipeline.test_answer import chat_answer, completed

RECORD = {
    "prompt_tokens": 3000, "kept_tokens": 1500, "evicted_tokens": 1500, "freed_blocks": 46,
    "seconds": 0.2, "recomputed": False,
}  # fmt: skip


def recorded(data: dict) -> dict[str, float] | None:
    reply = answer(completed(data), "chat", Wants(logprobs=True, token_ids=True), False, "r-1")
    request = parsed({"model": "auto", "messages": []}, t0=10.0)
    decision = Decision(Tier.FULL, "long", "classifier", 0.9, {"turns": 2.0})
    step = plan_step(request.body)
    outcome = Outcome(
        request, Routing(Tier.FULL, decision, SessionKeys(None)),
        Served(Tier.FULL, False, 1, "http://r", 1.0, None), 200, ended_at=10.5,
        captured=reply.captured, step=step,
    )  # fmt: skip
    return step_record(outcome, step).features


def test_a_compacted_step_records_what_was_kept() -> None:
    features = recorded(chat_answer(kv_transfer_params={"gearshift_kv_compaction": RECORD}))
    assert features == {
        "turns": 2.0, "kv_compaction_prompt_tokens": 3000.0, "kv_compaction_kept_tokens": 1500.0,
        "kv_compaction_evicted_tokens": 1500.0, "kv_compaction_freed_blocks": 46.0,
    }  # fmt: skip
    recomputed = recorded(
        chat_answer(kv_transfer_params={"gearshift_kv_compaction": {**RECORD, "recomputed": True}})
    )
    assert recomputed is not None and recomputed["kv_compaction_recomputed"] == 1.0
    # the watermark trigger compacts mid-answer: the cache held more than the prompt
    late = recorded(
        chat_answer(
            kv_transfer_params={"gearshift_kv_compaction": {**RECORD, "cached_tokens": 3200}}
        )
    )
    assert late is not None and late["kv_compaction_cached_tokens"] == 3200.0


def test_other_answers_record_no_compaction() -> None:
    for extra in ({}, {"kv_transfer_params": None}, {"kv_transfer_params": {"other": 1}},
                  {"kv_transfer_params": {"gearshift_kv_compaction": "junk"}},
                  {"kv_transfer_params": {"gearshift_kv_compaction": {"kept_tokens": "x"}}}):  # fmt: skip
        assert recorded(chat_answer(**extra)) == {"turns": 2.0}


def test_the_client_never_gets_the_record() -> None:
    """Recorded or not, the answer's body has vLLM's field as an uncompacted request has it
    (null), and otherwise the bytes the client would have had."""
    compacted = chat_answer(kv_transfer_params={"gearshift_kv_compaction": RECORD})
    plain = chat_answer(kv_transfer_params=None)
    for wants in (None, Wants(logprobs=True, token_ids=True), Wants(False, False)):
        reply = answer(completed(compacted), "chat", wants, False, "r-1")
        expected = answer(completed(plain), "chat", wants, False, "r-1")
        assert orjson.loads(reply.body) == orjson.loads(expected.body)
        assert b"gearshift_kv_compaction" not in reply.body
        if wants is not None:
            assert reply.captured is not None and reply.captured.kv_compaction == RECORD
