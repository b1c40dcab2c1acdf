"""Context management through the gateway, with the official ``openai`` client: a session
longer than its budget is answered, the replica gets the condensed messages, the answer's
header says what was done, and the store records what the model saw."""

from __future__ import annotations

import sqlite3
import time

import httpx
import openai
import orjson
import pytest

from tests.gateway.pipeline.context.agent import chat, session
from tests.integration.conftest import FULL_MODEL
from tests.support.fake_upstream import FakeUpstream

ON = {"x-gearshift-context": "auto", "x-gearshift-context-budget": "3000"}
# the stand-ins' /tokenize counts characters, not tokens: only the test of the exact count
# lets it decide (exact_margin 0: the router's estimate alone)
ESTIMATE = {"exact_margin": 0.0}


def fields(header: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in header.split(", "))


def condensed(make_stack, messages, context) -> tuple[dict[str, str], FakeUpstream, FakeUpstream]:
    """One request with context management on, through a stack of a full and a fast stand-in;
    the full tier's answer reaches the client. What the gateway says it did, and both tiers."""
    full, fast = FakeUpstream("full"), FakeUpstream("fast")
    stack = make_stack([full], [fast], context=context)
    raw = stack.client().chat.completions.with_raw_response.create(
        model="full", messages=messages, extra_headers=ON
    )
    assert raw.parse().choices[0].message.content == "hello from full"
    return fields(raw.headers["x-gearshift-context"]), full, fast


def test_a_long_tool_session_goes_to_the_mark_without_a_model_call(make_stack):
    """The default: masking leaves it above half the budget, so the extractive summary of
    the oldest turns takes it there; the latest `keep_recent_messages` stay whole."""
    messages = session(20)
    done, full, fast = condensed(make_stack, messages, ESTIMATE)
    assert done["summarizer"] == "extractive" and int(done["summarized"]) > 0
    assert int(done["tokens_after"]) <= 3000 * 0.5 < 3000 < int(done["tokens_before"])
    (sent,) = full.requests
    assert sent["messages"][-4:] == messages[-4:] and not fast.requests  # no model call


def test_a_long_tool_session_is_masked_and_answered(make_stack):
    messages = session(20)
    done, full, fast = condensed(make_stack, messages, {**ESTIMATE, "summarize_to_mark": False})
    assert int(done["masked"]) > 0 and done["summarized"] == "0"
    assert int(done["tokens_before"]) > 3000 >= int(done["tokens_after"])
    (sent,) = full.requests
    assert len(sent["messages"]) == len(messages)
    masked = [m for m in sent["messages"] if "removed by the gateway" in str(m.get("content"))]
    assert len(masked) == int(done["masked"])
    assert sent["messages"][-1] == messages[-1] and not fast.requests  # no summary needed


def test_a_long_chat_is_summarized_on_the_fast_tier(make_stack):
    messages = chat(16)
    done, full, fast = condensed(make_stack, messages, {**ESTIMATE, "summarizer": "fast"})
    assert int(done["summarized"]) > 0 and done["summarizer"] == "fast"
    (summary_request,) = fast.requests
    assert summary_request["model"] == "model-fast" and summary_request["max_tokens"] == 400
    (sent,) = full.requests
    assert sent["messages"][0] == messages[0] and sent["messages"][-1] == messages[-1]
    assert "hello from fast" in sent["messages"][1]["content"]  # the fast tier's summary


def test_by_default_a_long_chat_gets_the_extractive_summary_and_no_model_call(make_stack):
    """The default summarizer (docs/decisions/context-summarizer.md): the summarize rung
    keeps the chat's facts without asking the fast tier."""
    messages = chat(16)
    done, full, fast = condensed(make_stack, messages, ESTIMATE)
    assert int(done["summarized"]) > 0 and done["summarizer"] == "extractive"
    assert not fast.requests
    (sent,) = full.requests
    assert sent["messages"][0] == messages[0] and sent["messages"][-1] == messages[-1]
    assert "Order 4000" in sent["messages"][1]["content"]  # a fact the summary kept


def test_the_fast_tier_down_gives_the_extractive_summary(make_stack):
    full = FakeUpstream("full")
    context = {**ESTIMATE, "summarizer": "fast"}
    stack = make_stack([full], ["http://127.0.0.1:9"], context=context)  # nothing listens there
    raw = stack.client().chat.completions.with_raw_response.create(
        model="full", messages=chat(16), extra_headers=ON
    )
    assert fields(raw.headers["x-gearshift-context"])["summarizer"] == "extractive"
    assert "Order 4000" in full.requests[0]["messages"][1]["content"]


def test_a_stream_says_what_was_done_too(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    with stack.client().chat.completions.with_streaming_response.create(
        model="full", messages=session(20), stream=True, extra_headers=ON
    ) as raw:
        done = fields(raw.headers["x-gearshift-context"])
        assert int(done["tokens_after"]) < int(done["tokens_before"])
        assert "tok4" in "".join(raw.iter_lines())


def test_off_by_default_and_untouched(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    messages = session(20)
    raw = stack.client().chat.completions.with_raw_response.create(model="full", messages=messages)
    assert "x-gearshift-context" not in raw.headers
    assert full.requests[0]["messages"] == messages


def test_on_by_config_and_off_by_header(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context={**ESTIMATE, "mode": "auto", "budget_tokens": 3000})
    client = stack.client()
    on = client.chat.completions.with_raw_response.create(model="full", messages=session(20))
    done = fields(on.headers["x-gearshift-context"])
    assert int(done["tokens_after"]) <= 3000 < int(done["tokens_before"])
    off = client.chat.completions.with_raw_response.create(
        model="full", messages=session(20), extra_headers={"x-gearshift-context": "off"}
    )
    assert "x-gearshift-context" not in off.headers


def test_a_request_within_its_budget_is_untouched_and_unmarked(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    messages = session(2)
    raw = stack.client().chat.completions.with_raw_response.create(
        model="full", messages=messages, extra_headers=ON
    )
    assert "x-gearshift-context" not in raw.headers
    assert full.requests[0]["messages"] == messages


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-gearshift-context", "everything"), ("x-gearshift-context-budget", "-1")],
)
def test_a_bad_context_header_is_a_400(make_stack, name, value):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    with pytest.raises(openai.BadRequestError) as err:
        stack.client().chat.completions.create(
            model="full", messages=session(2), extra_headers={name: value}
        )
    assert err.value.body["param"] == name and not full.requests


def test_the_tiers_exact_count_decides_near_the_budget(make_stack):
    # the stand-in's /tokenize counts characters of the messages' JSON: far more than
    # the estimate, so only the exact count can say the request fits
    full = FakeUpstream("full")
    stack = make_stack([full], context={"exact_margin": 1.0})
    messages = session(20)
    budget = 20_000
    raw = stack.client().chat.completions.with_raw_response.create(
        model="full", messages=messages,
        extra_headers={"x-gearshift-context": "auto", "x-gearshift-context-budget": str(budget)},
    )  # fmt: skip
    done = fields(raw.headers["x-gearshift-context"])
    sent = full.requests[0]["messages"]
    exact = len(f"<chat>{orjson.dumps(sent).decode()}</chat>")
    assert int(done["tokens_after"]) == exact <= budget < int(done["tokens_before"])


def test_the_store_records_what_the_model_saw(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], context=ESTIMATE)
    client = stack.client()
    named = {**ON, "x-session-id": "long-1"}
    client.chat.completions.create(model=FULL_MODEL, messages=session(2), extra_headers=named)
    raw = client.chat.completions.with_raw_response.create(
        model=FULL_MODEL, messages=session(20), extra_headers=named
    )
    step_id = raw.headers["x-gearshift-step-id"]
    db = stack.store_url.removeprefix("sqlite:///")
    deadline = time.monotonic() + 10
    row = None
    while row is None and time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            try:
                row = conn.execute(
                    "SELECT b.body, s.route_reason FROM steps s JOIN blobs b "
                    "ON b.sha256 = s.request_sha256 WHERE s.id = ?",
                    (step_id,),
                ).fetchone()
            except sqlite3.OperationalError:  # the writer has not made the tables yet
                row = None
        time.sleep(0.05)
    assert row is not None
    body, reason = orjson.loads(row[0]), row[1]
    assert body["messages"] == full.requests[-1]["messages"]  # what the model saw
    assert "context: masked=" in reason
    shown = httpx.get(f"{stack.url}/v1/steps/{step_id}").json()
    assert shown["rewritten"] and shown["seq"] == 1  # never concatenated onto the first step
