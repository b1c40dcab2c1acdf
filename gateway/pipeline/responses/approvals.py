"""Human approval of hosted tool calls: requests, the answers to them, and what the model is told.

Two kinds of tool wait for a human: an MCP tool whose ``require_approval`` says so, and a
sandbox tool whose risk class the caller's grant holds for an approval (the sandbox
declares which, ``hosted.offer``; its requests have ``server_label: "sandbox"`` and the
tool's name, and an approved one runs with the approval passed to the sandbox).

    a step calls a tool that needs approval   the call is not run: it becomes an
                                              ``mcp_approval_request`` output item (with
                                              the model's ``call_id``) and the response
                                              ends after the step's other hosted calls
    the next request (previous_response_id)   answers every pending request of the chain:
                                              an ``mcp_approval_response`` input item
                                              (``approve``, ``reason``), or an operator's
                                              decision already stored on the response
                                              (``POST /v1/admin/approvals/{id}``)
    before its first model step               approved calls run, denied ones are told to
                                              the model as a denial: each becomes an
                                              ``mcp_call`` output item with
                                              ``approval_request_id``

Every request, answer and approver is stored with the response's items: requests as
output items, a client's answers as input items with ``approver: "client:<key name>"``,
an operator's as items of the response that asked (``approver: "operator"``). Every
wrong answer is a 400 naming the field, before anything runs or is stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.pipeline.responses.items import new_id

REQUEST = "mcp_approval_request"
RESPONSE = "mcp_approval_response"
OPERATOR = "operator"


def request_item(label: str, name: str, call_id: str, arguments: str = "") -> dict[str, Any]:
    """A call that waits for approval (``call_id``: the model's tool call id, an extension)."""
    return {
        "id": new_id("mcpr"), "type": REQUEST, "server_label": label, "name": name,
        "arguments": arguments, "call_id": call_id,
    }  # fmt: skip


def decision_item(
    request_id: str, approve: bool, reason: str | None, approver: str
) -> dict[str, Any]:
    return {
        "id": new_id("mcpa"), "type": RESPONSE, "approval_request_id": request_id,
        "approve": approve, "reason": reason, "approver": approver,
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decision:
    request: dict[str, Any]  # the mcp_approval_request item
    approve: bool
    reason: str | None
    approver: str


def requests(items: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["id"]: i for i in items if i["type"] == REQUEST}


def answered(items: Iterable[dict[str, Any]]) -> set[str]:
    """Approval requests whose call has run or been denied (an mcp_call names them)."""
    return {
        str(i["approval_request_id"])
        for i in items
        if i["type"] == "mcp_call" and i.get("approval_request_id")
    }


def resolve(
    history: Sequence[dict[str, Any]], inputs: Sequence[dict[str, Any]], *,
    continuing: bool, labels: set[str], approver: str,
) -> list[Decision]:  # fmt: skip
    """The decisions this request applies, in the order of the requests; a 400 naming the
    field for an answer to no request of the chain (another tenant's included: its chain
    is not this one), to one already answered, a second answer, an approval of a server
    this request does not offer, or a pending request left unanswered."""
    asked = requests(history)
    done = answered(history)
    operator = {i["approval_request_id"]: i for i in history if i["type"] == RESPONSE}
    given: dict[str, Decision] = {}
    for j, item in enumerate(inputs):
        if item["type"] != RESPONSE:
            continue
        where = f"input[{j}]"
        if not continuing:
            raise InvalidRequest(
                f"{where} answers an approval request, which needs the previous_response_id "
                "of the response that asked",
                param="previous_response_id",
            )
        rid = item["approval_request_id"]
        field = f"{where}.approval_request_id"
        request = asked.get(rid)
        if request is None:
            raise InvalidRequest(
                f"{field}: no mcp_approval_request {rid!r} in the previous_response_id chain",
                param=field,
            )
        if rid in done or rid in given:
            again = "in this request" if rid in given else "already"
            raise InvalidRequest(
                f"{field}: approval request {rid!r} was answered {again}", param=field
            )
        if rid in operator:
            raise InvalidRequest(
                f"{field}: approval request {rid!r} was already decided by an operator",
                param=field,
            )
        if item["approve"] and request["server_label"] not in labels:
            raise InvalidRequest(
                f"{field}: approving a call of MCP server {request['server_label']!r} needs "
                "that server's mcp tool in this request's tools",
                param=field,
            )
        item["approver"] = approver
        given[rid] = Decision(request, item["approve"], item.get("reason"), approver)
    out: list[Decision] = []
    for rid, request in asked.items():
        if rid in done:
            continue
        if rid in given:
            out.append(given[rid])
        elif rid in operator:
            d = operator[rid]
            if d["approve"] and request["server_label"] not in labels:
                raise InvalidRequest(
                    f"approval request {rid!r} was approved by an operator: this request's "
                    f"tools must include the mcp tool of server {request['server_label']!r}",
                    param="tools",
                )
            out.append(Decision(request, d["approve"], d.get("reason"), d["approver"]))
        else:
            raise InvalidRequest(
                f"approval request {rid!r} (tool {request['name']!r} of MCP server "
                f"{request['server_label']!r}) is pending: answer it with an "
                "mcp_approval_response input item",
                param="input",
            )
    return out


def call_item(decision: Decision) -> dict[str, Any]:
    """The ``mcp_call`` item a decision makes (settled when it runs, or as a denial)."""
    r = decision.request
    return {
        "id": new_id("mcp"), "type": "mcp_call", "status": "in_progress",
        "server_label": r["server_label"], "name": r["name"], "arguments": r["arguments"],
        "output": None, "error": None, "call_id": r["call_id"], "approval_request_id": r["id"],
    }  # fmt: skip


def denial(decision: Decision) -> str:
    """What the model is told of a denied call."""
    why = f": {decision.reason}" if decision.reason else ""
    return f"error: denied: the call was not approved (by {decision.approver}){why}"
