"""A context summary's model calls in exports: left out of the agent's steps by default,
included or exported alone on request; the condensed step and the steps after it export
as one run from the summarised context (real SQLite store, the recorder's own writer)."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from gateway.cli.main import main
from gateway.export.load import Filter
from gateway.export.routing import logged_steps
from gateway.recording.records import StepRecord
from gateway.store.rewards import DEFAULT_WEIGHTS
from tests.gateway.export.test_formats import CALL, SYSTEM, USER, record, run, store, write

__all__ = ["store"]  # the fixture, shared with test_formats

A1 = {"role": "assistant", "content": None, "tool_calls": [CALL]}
TOOL = {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"}
A2 = {"role": "assistant", "content": "Sunny. Anything else?"}
ASK = {"role": "user", "content": "And tomorrow?"}
# The condensed history the model saw at the third step: the summary in place of turns 1-2.
CONDENSED = [SYSTEM, {"role": "user", "content": "Summary: Paris is sunny, 21C."}, ASK]
A3 = {"role": "assistant", "content": "Rain."}
THANKS = {"role": "user", "content": "Thanks."}
A4 = {"role": "assistant", "content": "You're welcome."}


def _routed(rec: StepRecord) -> StepRecord:
    return dataclasses.replace(rec, policy="threshold", propensity=0.8)


def _summary_call() -> dict:
    """The fast tier's summary call, as the context stage hands it to the recorder."""
    answer = {
        "model": "m-fast",
        "usage": {"prompt_tokens": 2, "completion_tokens": 2},
        "prompt_token_ids": [50, 51],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris is sunny, 21C."},
                "token_ids": [52, 53],
                "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
                "finish_reason": "stop",
            }
        ],
    }
    return {
        "id": uuid.uuid4().hex, "created_at": time.time(), "tier": "fast", "replica": "r",
        "duration_ms": 5.0, "answer": answer,
        "request": {"messages": [{"role": "user", "content": "Summarize: ..."}]},
    }  # fmt: skip


def condensed_session(engine) -> None:
    """Two agent steps, then a step whose history was summarised (the summary's model call
    recorded before it), then a step that extends the condensed one."""
    write(
        engine,
        _routed(record("acme", [SYSTEM, USER], A1, [1, 2, 3], [4, 5, 6], tier="fast")),
        _routed(record("acme", [SYSTEM, USER, A1, TOOL], A2, [1, 2, 3, 4, 5, 6, 7, 8], [9, 10])),
    )
    condensed = record("acme", CONDENSED, A3, [1, 2, 60, 61], [62])
    context = {
        "api": "chat", "masked": 0, "clipped": 0, "summarized": 3, "dropped": 0,
        "tokens_before": 4000, "tokens_after": 900, "exact": True, "summarizer": "fast",
        "summary": "Paris is sunny, 21C.", "summary_steps": [_summary_call()],
    }  # fmt: skip
    write(engine, _routed(dataclasses.replace(condensed, context=context)))
    write(
        engine,
        _routed(record("acme", [*CONDENSED, A3, THANKS], A4, [1, 2, 60, 61, 62, 63], [64, 65])),
    )


def test_token_exports_leave_summary_calls_out_and_cut_at_the_condensed_step(store, tmp_path):
    _, engine = store
    condensed_session(engine)
    before, after = run(engine, "verl", tmp_path / "v.parquet")
    assert before["prompt_ids"] == [1, 2, 3] and before["response_mask"] == [1, 1, 1, 0, 0, 1, 1]
    # the condensed step's prompt is the summarised context; the next step extends it
    assert after["prompt_ids"] == [1, 2, 60, 61]
    assert after["response_ids"] == [62, 63, 64, 65]
    assert after["response_mask"] == [1, 0, 1, 1]
    assert [s["tier"] for s in after["tier_spans"]] == ["full", "full"]
    [summary] = run(engine, "openrlhf", tmp_path / "o.jsonl", summaries="only")
    assert summary["observation_tokens"] == [50, 51, 52, 53]
    assert summary["action_ranges"] == [[2, 4]] and summary["rollout_log_probs"] == [-0.5, -0.25]
    both = run(engine, "verl", tmp_path / "b.parquet", summaries="include")
    assert [r["prompt_ids"][:3] for r in both] == [[1, 2, 3], [50, 51], [1, 2, 60]]


def test_message_exports_start_the_condensed_run_from_the_context_the_model_saw(store, tmp_path):
    _, engine = store
    condensed_session(engine)
    first, second = run(engine, "openai-sft", tmp_path / "o.jsonl")
    assert [m["role"] for m in first["messages"]] == [
        "system", "user", "assistant", "tool", "assistant"
    ]  # fmt: skip
    assert second["messages"] == [*CONDENSED, {**A3, "weight": 1}, THANKS, {**A4, "weight": 1}]
    lossless = run(engine, "jsonl", tmp_path / "l.jsonl")
    assert [s["policy"] for s in lossless[0]["steps"]] == ["threshold"] * 4
    [alone] = run(engine, "trl-sft", tmp_path / "t.jsonl", summaries="only")
    assert alone["messages"][-1]["content"] == "Paris is sunny, 21C."
    assert alone["gearshift"]["steps"][0]["tier"] == "fast"
    rows = run(engine, "trl-stepwise", tmp_path / "s.jsonl", summaries="include")
    assert [len(r["completions"]) for r in rows] == [2, 1, 2]  # agent run, summary, agent run


def test_router_training_never_reads_a_summary_call_as_a_routing_decision(store):
    _, engine = store
    condensed_session(engine)
    with engine.connect() as conn:
        logged = list(logged_steps(conn, Filter(summaries="include"), DEFAULT_WEIGHTS))
    assert len(logged) == 4 and {step.propensity for step in logged} == {0.8}


def test_cli_export_summaries_option(store, tmp_path, capsys):
    url, engine = store
    condensed_session(engine)
    out = tmp_path / "cli.jsonl"
    assert main(["export", "--format", "openrlhf", "--store", url, str(out)]) == 0
    assert "wrote 2 rows from 1 sessions" in capsys.readouterr().out
    args = ["export", "--format", "openrlhf", "--store", url, "--summaries", "only", str(out)]
    assert main(args) == 0
    assert "wrote 1 rows from 1 sessions" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["export", "--format", "jsonl", "--store", url, "--summaries", "some", str(out)])
    assert "invalid choice: 'some'" in capsys.readouterr().err
