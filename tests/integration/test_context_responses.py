"""Context management of the Responses API, with the official ``openai`` client:
``truncation: "auto"`` condenses a stored chain, ``responses.compact`` turns a chain into
its user messages and one compaction item that a later request takes as input; each
condensation is a session event in the store, its summary call a step of the session."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.auth import hash_key
from gateway.export.formats import FORMATS, export
from gateway.export.load import Filter
from gateway.store.database import make_engine
from gateway.store.rewards import DEFAULT_WEIGHTS
from tests.gateway.pipeline.context.agent import output
from tests.integration.conftest import FULL_MODEL
from tests.support.fake_upstream import FakeUpstream

# the stand-ins count characters; masking alone (no summary to the low-water mark), so that
# a condensed chain is recognised by its placeholders
ESTIMATE = {"exact_margin": 0.0, "budget_tokens": 3000, "summarize_to_mark": False}


def fields(header: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in header.split(", "))


def tool_history(steps: int, chars: int = 2000) -> list[dict[str, Any]]:
    """A function-call loop as Responses input items: call, output, call, output, ..."""
    out: list[dict[str, Any]] = [
        {"role": "user", "content": "Find why tests/test_orders.py fails and fix it."}
    ]
    for i in range(steps):
        out.append({"type": "function_call", "call_id": f"call_{i}", "name": "run_shell",
                    "arguments": f'{{"cmd": "cat part_{i}.txt"}}'})  # fmt: skip
        out.append({"type": "function_call_output", "call_id": f"call_{i}",
                    "output": output(i, chars)})  # fmt: skip
    return out


def rows(store_url: str, sql: str, args: tuple[Any, ...] = (), want: int = 1) -> list[Any]:
    """Rows of ``sql`` once there are ``want`` of them (the recorder writes behind)."""
    db = store_url.removeprefix("sqlite:///")
    deadline = time.monotonic() + 10
    found: list[Any] = []
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            found = conn.execute(sql, args).fetchall()
        if len(found) >= want:
            return found
        time.sleep(0.05)
    return found


def test_truncation_auto_condenses_a_stored_chain(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    client = stack.client()
    first = client.responses.create(model="full", input=tool_history(20), truncation="auto")
    assert first.truncation == "auto" and first.output_text == "hello from full"
    sent = full.requests[-1]["messages"]
    masked = [m for m in sent if "removed by the gateway" in str(m.get("content"))]
    assert masked and len(sent) == 41  # the calls stay, their old outputs are masked
    # the next request sends only what is new; the stored chain is condensed again
    raw = client.responses.with_raw_response.create(
        model="full", input="and now?", previous_response_id=first.id, truncation="auto"
    )
    assert raw.parse().output_text == "hello from full"
    done = fields(raw.headers["x-gearshift-context"])
    assert int(done["masked"]) == len(masked) and int(done["tokens_before"]) > 3000
    assert full.requests[-1]["messages"][-1] == {"role": "user", "content": "and now?"}
    # without truncation (OpenAI's default: disabled) the chain goes as it is
    plain = client.responses.with_raw_response.create(
        model="full", input="again", previous_response_id=first.id
    )
    assert "x-gearshift-context" not in plain.headers and plain.parse().truncation == "disabled"
    assert not any("removed by the gateway" in str(m.get("content"))
                   for m in full.requests[-1]["messages"])  # fmt: skip


def test_a_tenant_or_key_sets_the_truncation_default(make_stack):
    keys = {"a1": "gs-key-a1", "a2": "gs-key-a2", "b": "gs-key-b"}
    tenant = {"a1": "a", "a2": "a", "b": "b"}
    auth = {"mode": "keys", "keys": [
        {"name": n, "tenant": tenant[n], "sha256": hash_key(k)} for n, k in keys.items()
    ]}  # fmt: skip
    overrides = {
        "tenants": {"a": {"truncation": "auto"}},
        "keys": {"a2": {"truncation": "disabled"}},
    }
    full = FakeUpstream("full")
    stack = make_stack([full], context={**ESTIMATE, **overrides}, auth=auth)

    def masked(name: str, **extra: Any) -> tuple[str, bool]:
        made = stack.client(api_key=keys[name]).responses.create(
            model="full", input=tool_history(8), **extra
        )
        sent = full.requests[-1]["messages"]
        return made.truncation, any("removed by the gateway" in str(m["content"]) for m in sent)

    assert masked("a1") == ("auto", True)  # the tenant's default, without asking
    assert masked("a1", truncation="disabled") == ("disabled", False)  # the request wins
    assert masked("a2") == ("disabled", False)  # the key's over its tenant's
    assert masked("b") == ("disabled", False)  # the config's (OpenAI's default)
    assert masked("b", truncation="auto") == ("auto", True)


def test_truncation_must_be_auto_or_disabled(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    with pytest.raises(openai.BadRequestError) as err:
        stack.client().responses.create(model="full", input="hi", truncation="sometimes")  # type: ignore[arg-type]
    assert err.value.body["param"] == "truncation" and not full.requests


def test_compact_a_chain_and_continue_from_its_output(make_stack):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast], context={**ESTIMATE, "summarizer": "fast"})
    client = stack.client()
    first = client.responses.create(model="full", input=tool_history(6))
    compacted = client.responses.compact(model="full", previous_response_id=first.id)
    assert compacted.object == "response.compaction" and compacted.id.startswith("cmpr_")
    *users, item = compacted.output
    assert [u.role for u in users] == ["user"] and item.type == "compaction"
    assert item.encrypted_content == "hello from fast" and item.created_by == "fast"
    (summary_request,) = fast.requests
    assert "checksum 1000" in summary_request["messages"][1]["content"]  # the history read
    assert compacted.usage.input_tokens == 7 and compacted.usage.output_tokens == 4
    # the compacted output is the next request's input: the summary as a user message
    then = [o.model_dump(exclude_none=True, warnings=False) for o in compacted.output]
    client.responses.create(model="full", input=[*then, {"role": "user", "content": "go on"}])
    sent = full.requests[-1]["messages"]
    assert sent[0]["content"].startswith("Find why") and "hello from fast" in sent[1]["content"]
    assert sent[-1] == {"role": "user", "content": "go on"} and len(sent) == 3
    # compacting that again folds the earlier summary in
    client.responses.compact(model="full", input=[*then, {"role": "user", "content": "more"}])
    assert "Earlier summary:\nhello from fast" in fast.requests[-1]["messages"][1]["content"]


def test_compact_without_the_fast_tier_is_extractive(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], ["http://127.0.0.1:9"], context=ESTIMATE)
    compacted = stack.client().responses.compact(model="full", input=tool_history(4))
    item = compacted.output[-1]
    assert item.created_by == "extractive" and "checksum 1003" in item.encrypted_content
    assert compacted.usage.input_tokens == 0 and not full.requests


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "full"}, 400, "input"),
        ({"model": "full", "input": []}, 400, "input"),
        ({"model": "nope", "input": "hi"}, 404, "model"),
        ({"model": "full", "input": "hi", "tools": []}, 400, "tools"),
        ({"model": "full", "input": "hi", "image": {"x": 1}}, 400, "image"),
        ({"model": "full", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
        ({"model": "full", "input": [{"type": "compaction", "encrypted_content": 5}]}, 400,
         "input[0].encrypted_content"),
        ({"model": "full", "input": [{"type": "compaction", "encrypted_content": "s"}]}, 400,
         "input"),
    ],
)  # fmt: skip
def test_compact_refuses_bad_input_by_name(make_stack, body, status, param):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast], context=ESTIMATE)
    with pytest.raises(openai.APIStatusError) as err:
        stack.client().post("/responses/compact", body=body, cast_to=object)
    assert err.value.status_code == status and err.value.body["param"] == param
    assert not fast.requests and not full.requests


def test_condensations_are_session_events_and_summaries_are_steps(make_stack, tmp_path: Path):
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    # no tool output long enough to mask: the span is summarized on the fast tier
    stack = make_stack(
        [full], [fast], context={**ESTIMATE, "rungs": ["summarize", "drop"], "summarizer": "fast"}
    )
    client = stack.client()
    named = {"x-session-id": "long-2", "x-gearshift-context": "auto"}
    raw = client.chat.completions.with_raw_response.create(
        model=FULL_MODEL, messages=_chat(16), extra_headers=named
    )
    step_id = raw.headers["x-gearshift-step-id"]
    (event,) = rows(
        stack.store_url,
        "SELECT api, masked, summarized, dropped, tokens_before, tokens_after, summarizer, "
        "summary, summary_step_id, session_id FROM context_events WHERE step_id = ?",
        (step_id,),
    )
    api, masked, summarized, dropped, before, after, by, summary, summary_step, sid = event
    assert (api, masked, dropped, by, summary) == ("chat", 0, 0, "fast", "hello from fast")
    assert summarized > 0 and before > 3000 >= after
    steps = rows(
        stack.store_url,
        "SELECT id, seq, tier, policy, route_reason, completion_token_ids IS NOT NULL "
        "FROM steps WHERE session_id = ? ORDER BY seq",
        (sid,),
        want=2,
    )
    assert [s[0] for s in steps] == [summary_step, step_id]  # the summary first
    assert steps[0][2:5] == ("fast", "context-summary", f"context summary for step {step_id}")
    assert steps[0][5] == 1  # the summarizing tier's own token ids
    # a Responses chain's condensation and a compaction are events too
    client.responses.create(model="full", input=tool_history(20), truncation="auto")
    client.responses.compact(model="full", input=tool_history(3))
    apis = rows(stack.store_url, "SELECT api FROM context_events ORDER BY id", want=3)
    assert [a for (a,) in apis] == ["chat", "responses", "compact"]
    # every trajectory export format reads these sessions; summary steps only when asked
    engine = make_engine(stack.store_url)
    try:
        for fmt in FORMATS:
            out = tmp_path / f"export-{fmt}"
            done = export(engine, fmt, out, Filter(), DEFAULT_WEIGHTS, progress=False)
            # the compaction's session holds only its summary call
            assert done.sessions == 2 and done.rows > 0, fmt
        assert "context-summary" not in (tmp_path / "export-jsonl").read_text()
        out = tmp_path / "summaries.jsonl"
        export(engine, "jsonl", out, Filter(summaries="only"), DEFAULT_WEIGHTS, progress=False)
    finally:
        engine.dispose()
    assert out.read_text().count('"policy":"context-summary"') == 3  # one per event


def _chat(turns: int) -> list[dict[str, Any]]:
    from tests.gateway.pipeline.context.agent import chat

    return chat(turns)
