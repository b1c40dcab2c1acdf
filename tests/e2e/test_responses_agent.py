"""End to end: the hosted agent loop's MCP tools, human approvals and background runs,
through the official ``openai`` SDK, on ``gearshift serve`` over real vLLM servers, the
embedded sandbox (bubblewrap), the SQLite store and a real MCP server on loopback
(``tests.support.mcp_server``, allowed by the session's stack: ``conftest.real_stack``).

The default model calls a tool only when forced, so each tool step is forced
(``tool_choice``) and its prompt shows the call to make; vLLM's guided decoding keeps the
arguments to the tool's schema, so the assertions read the arguments the model chose
rather than assume them. Every test runs two or three short model steps on the full tier.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.e2e.test_embedded_stack import FULL
from tests.e2e.test_responses_real import COPY, session

pytestmark = pytest.mark.e2e

ADD_TASK = COPY + '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
FORCE_ADD: Any = {"type": "mcp", "server_label": "demo", "name": "add"}
WRITE_TASK = (
    COPY
    + '<tool_call>\n{"name": "write_file", "arguments": {"path": "note.txt", "content": "hi"}}'
    + "\n</tool_call>"
)
WRITE: Any = {"type": "sandbox", "name": "write_file"}
# max_output_tokens counts over all the steps of a response: room for a call and a reply
STEP: Any = {"model": FULL, "max_output_tokens": 96, "temperature": 0}


def demo(url: str, approval: str) -> Any:
    return {
        "type": "mcp", "server_label": "demo", "server_url": url,
        "allowed_tools": ["add"], "require_approval": approval,
    }  # fmt: skip


def answer(request_id: str, approve: bool) -> list[Any]:
    return [{"type": "mcp_approval_response", "approval_request_id": request_id,
             "approve": approve, "reason": None if approve else "not today"}]  # fmt: skip


def test_an_mcp_tool_is_listed_called_and_its_result_answered(real_stack, mcp_url):
    client = real_stack.client()
    r = client.responses.create(
        input=ADD_TASK, tools=[demo(mcp_url, "never")], tool_choice=FORCE_ADD,
        max_tool_calls=1, **STEP,
    )  # fmt: skip
    assert [o.type for o in r.output][:2] == ["mcp_list_tools", "mcp_call"]
    listing, call = r.output[0], r.output[1]
    # the server's whole listing; the model is offered the allowed tools only
    assert sorted(t.name for t in listing.tools) == ["add", "boom", "shout"]  # type: ignore[union-attr]
    assert call.name == "add" and call.status == "completed"  # type: ignore[union-attr]
    args = json.loads(call.arguments)  # type: ignore[union-attr]
    assert call.output == str(args["a"] + args["b"])  # type: ignore[union-attr]  # the server ran it
    # the model stepped again with the result (the call is not forced after the first step;
    # a second call would end the response incomplete: max_tool_calls)
    steps = session(real_stack, r.id)["steps"]
    assert [s["seq"] for s in steps] == [0, 1] and all(s["completion_token_ids"] for s in steps)
    assert r.status in ("completed", "incomplete") and r.output[-1].type in ("message", "mcp_call")


def test_an_mcp_call_waits_for_approval_then_runs_or_is_denied(real_stack, mcp_url):
    client = real_stack.client()
    tools = [demo(mcp_url, "always")]
    outcomes = {}
    for approve in (True, False):
        asked = client.responses.create(input=ADD_TASK, tools=tools, tool_choice=FORCE_ADD, **STEP)
        request = asked.output[-1]
        assert asked.status == "completed" and request.type == "mcp_approval_request"
        assert request.name == "add"  # type: ignore[union-attr]  # nothing ran yet
        done = client.responses.create(
            previous_response_id=asked.id, tools=tools, input=answer(request.id, approve), **STEP
        )
        call = done.output[0]
        assert call.type == "mcp_call" and call.approval_request_id == request.id  # type: ignore[union-attr]
        # the model went on after the decision (it may ask for the tool again: held again)
        assert done.output[-1].type in ("message", "mcp_approval_request")
        assert len(session(real_stack, asked.id)["steps"]) >= 2
        outcomes[approve] = call
    ran, refused = outcomes[True], outcomes[False]
    args = json.loads(ran.arguments)  # type: ignore[union-attr]
    assert ran.status == "completed" and ran.output == str(args["a"] + args["b"])  # type: ignore[union-attr]
    assert refused.status == "failed" and refused.output is not None  # type: ignore[union-attr]
    assert refused.output.startswith("error: denied: ") and "not today" in refused.output  # type: ignore[union-attr]


def test_a_sandbox_write_waits_for_an_operator(real_stack):
    """The grant holds ``mutating`` tools for approval: the write waits as an
    ``mcp_approval_request``, an operator approves it on the admin API, and the next
    request runs it in the sandbox."""
    client = real_stack.client()
    asked = client.responses.create(input=WRITE_TASK, tools=[WRITE], tool_choice="required", **STEP)
    request = asked.output[-1]
    assert request.type == "mcp_approval_request" and request.name == "write_file"  # type: ignore[union-attr]
    assert request.server_label == "sandbox"  # type: ignore[union-attr]
    pending = httpx.get(real_stack.url + "/admin/v1/approvals", timeout=30).json()["data"]
    assert request.id in [p["id"] for p in pending]
    decided = httpx.post(
        real_stack.url + f"/admin/v1/approvals/{request.id}", json={"approve": True}, timeout=30
    )
    assert decided.status_code == 200, decided.text
    done = client.responses.create(
        previous_response_id=asked.id, tools=[WRITE], input="Go on.", **STEP
    )
    wrote = done.output[0]
    assert wrote.type == "mcp_call" and wrote.name == "write_file"  # type: ignore[union-attr]
    assert wrote.status == "completed" and wrote.error is None  # type: ignore[union-attr]
    assert wrote.approval_request_id == request.id  # type: ignore[union-attr]


def test_a_background_run_is_cancelled_and_the_stack_serves_on(real_stack):
    client = real_stack.client()
    r = client.responses.create(
        model=FULL, input="Count from 1 to 5000, one number per line.", background=True,
        max_output_tokens=4000, temperature=0,
    )  # fmt: skip
    assert r.status in ("queued", "in_progress")
    deadline = time.monotonic() + 120
    while client.responses.retrieve(r.id).status == "queued":  # the step has started
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(r.id).status == "cancelled"
    after = client.responses.create(input="Say hi.", **{**STEP, "max_output_tokens": 4})
    assert after.status in ("completed", "incomplete") and after.output_text
