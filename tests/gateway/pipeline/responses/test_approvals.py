"""Approval requests and their answers: which decisions apply, what the model is told."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.pipeline.responses import approvals, hosted, mcp_tools
from gateway.pipeline.responses.items import normalize_input, to_messages


def asked(call_id: str = "call_1", label: str = "docs") -> dict[str, Any]:
    return approvals.request_item(label, "shout", call_id, '{"text": "hi"}')


def answer(request_id: str, approve: bool = True, **kw: Any) -> dict[str, Any]:
    item = {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": approve}
    return normalize_input([{**item, **kw}])[0]


def resolve(history: list[dict[str, Any]], inputs: list[dict[str, Any]], **kw: Any) -> Any:
    args: dict[str, Any] = {"continuing": True, "labels": {"docs"}, "approver": "client:k"} | kw
    return approvals.resolve(history, inputs, **args)


def test_each_pending_request_gets_its_decision_in_order() -> None:
    one, two = asked("c1"), asked("c2")
    inputs = [answer(two["id"], False, reason="no"), answer(one["id"])]
    out = resolve([{"type": "message"}, one, two], inputs)
    assert [(d.request["id"], d.approve, d.reason, d.approver) for d in out] == [
        (one["id"], True, None, "client:k"), (two["id"], False, "no", "client:k"),
    ]  # fmt: skip
    assert inputs[0]["approver"] == "client:k"  # stored with the input item


def test_an_operators_decision_applies_and_cannot_be_answered_again() -> None:
    request = asked()
    decided = approvals.decision_item(request["id"], True, "fine", "operator:ops")
    (d,) = resolve([request, decided], [])
    assert (d.approve, d.approver) == (True, "operator:ops")
    with pytest.raises(InvalidRequest) as err:
        resolve([request, decided], [answer(request["id"])])
    assert err.value.param == "input[0].approval_request_id"


@pytest.mark.parametrize(
    ("history", "inputs", "kw", "param"),
    [
        ([], [answer("mcpr_x")], {"continuing": False}, "previous_response_id"),
        ([asked()], [answer("mcpr_other")], {}, "input[0].approval_request_id"),
        ([], [answer("mcpr_x")], {}, "input[0].approval_request_id"),
        ([asked()], [], {}, "input"),  # left pending
    ],
)
def test_wrong_answers_name_the_field(
    history: list[dict[str, Any]], inputs: list[dict[str, Any]], kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        resolve(history, inputs, **kw)
    assert err.value.param == param, err.value.message


def test_duplicates_and_servers_not_offered_are_refused() -> None:
    request = asked()
    rid = request["id"]
    with pytest.raises(InvalidRequest) as err:
        resolve([request], [answer(rid), answer(rid)])
    assert err.value.param == "input[1].approval_request_id"
    ran = {"type": "mcp_call", "approval_request_id": rid}
    with pytest.raises(InvalidRequest) as err:
        resolve([request, ran], [answer(rid)])
    assert "already" in err.value.message
    with pytest.raises(InvalidRequest):
        resolve([request], [answer(rid)], labels=set())
    (denied,) = resolve([request], [answer(rid, False)], labels=set())  # a denial needs none
    assert approvals.denial(denied) == "error: denied: the call was not approved (by client:k)"


def test_the_model_sees_the_call_then_its_result() -> None:
    request = asked()
    (decision,) = resolve([request], [answer(request["id"])])
    result = approvals.call_item(decision) | {"output": "HI", "status": "completed"}
    messages = to_messages(
        [{"id": "m", "type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "shout"}]},
         {"id": "l", "type": "mcp_list_tools", "server_label": "docs", "tools": []}, request],
        [answer(request["id"]), result], None,
    )  # fmt: skip
    assert messages == [
        {"role": "user", "content": "shout"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "shout", "arguments": '{"text": "hi"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "HI"},
    ]  # fmt: skip


def test_a_held_sandbox_tool_is_claimed_as_an_approval_request_of_the_sandbox() -> None:
    kinds = {"run_python": mcp_tools.kind(hosted.SERVER_LABEL, True), "read_file": "sandbox"}
    call = {"type": "function_call", "name": "run_python", "call_id": "call_9",
            "arguments": '{"code": "1"}'}  # fmt: skip
    item, _ = hosted.claim(call, kinds, "sess")
    assert item["type"] == "mcp_approval_request" and item["server_label"] == "sandbox"
    assert (item["name"], item["arguments"], item["call_id"]) == (
        "run_python",
        '{"code": "1"}',
        "call_9",
    )
    # approved: the call it makes is the sandbox tool's, told with the request
    (decision,) = resolve([item], [answer(item["id"])], labels={"sandbox"})
    ran = approvals.call_item(decision)
    assert (ran["type"], ran["server_label"], ran["name"]) == ("mcp_call", "sandbox", "run_python")
    # approving needs a sandbox tool in this request's tools (the label "sandbox")
    with pytest.raises(InvalidRequest) as err:
        resolve([item], [answer(item["id"])], labels=set())
    assert err.value.param == "input[0].approval_request_id"
