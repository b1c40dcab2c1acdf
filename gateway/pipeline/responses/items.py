"""Input items: checked and normalized once, then turned into chat messages.

A request's ``input`` (a string, or a list of items) becomes a list of items in the shape
``GET /v1/responses/{id}/input_items`` lists them (every item with an ``id`` and a
``status``; message content as parts). The same shape is stored, so a chain of responses
(``previous_response_id``) is the concatenation of each one's input and output items, and
one function (``to_messages``) turns any chain into the chat messages the tiers see.

Every problem is a 400 naming the field (``input[2].content[0].text``), raised before
anything is stored or sent upstream. Item types OpenAI defines but this slice does not
serve (reasoning, item references, hosted tool calls, MCP approvals) are a 400 saying so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.pipeline.responses.hosted_input import HOSTED_INPUT_TYPES, hosted_item

INPUT_ROLES = ("user", "system", "developer")
ROLES = (*INPUT_ROLES, "assistant")
# keys OpenAI defines on an item that carry nothing the chat request could use
IGNORED_KEYS = frozenset({"id", "type", "status", "phase", "caller", "namespace", "created_by"})
KNOWN_KEYS = {
    "message": frozenset({"role", "content"}),
    "function_call": frozenset({"call_id", "name", "arguments"}),
    "function_call_output": frozenset({"call_id", "output"}),
    "mcp_approval_response": frozenset({"approval_request_id", "approve", "reason"}),
    "compaction": frozenset({"encrypted_content"}),  # from /v1/responses/compact
}
PART_KEYS = frozenset({"type", "text", "annotations", "logprobs", "refusal"})
NOT_YET_TYPES = frozenset(
    {
        "reasoning", "item_reference", "file_search_call", "computer_call",
        "computer_call_output", "web_search_call", "image_generation_call",
        "local_shell_call", "local_shell_call_output",
        "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
        "mcp_approval_request",
        "custom_tool_call", "custom_tool_call_output", "tool_search_call",
        "tool_search_output",
    }
)  # fmt: skip
# output items of calls the gateway ran (hosted tools); a client may send them back
# (hosted_input: its own context, replayed, never run)
HOSTED_ITEMS = ("code_interpreter_call", "mcp_call")
CODE_TOOL = "run_python"  # the sandbox tool a code_interpreter_call ran
ID_PREFIX = {
    "message": "msg", "function_call": "fc", "function_call_output": "fco",
    "mcp_approval_response": "mcpa", "compaction": "cmp", "code_interpreter_call": "ci",
    "mcp_call": "mcp", "mcp_list_tools": "mcpl",
}  # fmt: skip
COMPACTED = (
    "[Summary of the earlier conversation, compacted by the gateway; what is marked DONE "
    "was done already: do not do it again.]\n"
)
MAX_COMPACTION_CHARS = 200_000


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"


def normalize_input(value: str | list[Any], taken: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The request's ``input`` as stored items; ``taken``: item ids already in the chain."""
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}], None)]
    if not value:
        raise InvalidRequest("input must not be an empty list", param="input")
    taken_ids = set(taken)
    seen = set(taken_ids)
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        item = _item(raw, where)
        settles = item.get("approval_request_id") if item["type"] == "mcp_call" else None
        if settles is not None and settles in taken_ids:
            raise InvalidRequest(
                f"{where}.approval_request_id: an mcp_call input cannot settle approval request "
                f"{settles!r} of the previous_response_id chain; answer it with an "
                "mcp_approval_response item",
                param=f"{where}.approval_request_id",
            )
        if item["id"] in seen:
            raise InvalidRequest(
                f"duplicate item id {item['id']!r}: it is already in this request or in the "
                "previous_response_id chain (send new items only when you continue a response)",
                param=f"{where}.id",
            )
        seen.add(item["id"])
        out.append(item)
    return out


def _item(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where} must be an object (an input item)", param=where)
    kind = raw.get("type", "message")  # EasyInputMessage: {"role", "content"}
    if kind in NOT_YET_TYPES:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported yet: this gateway's /v1/responses takes "
            "message, function_call, function_call_output, mcp_approval_response, compaction "
            "and the hosted calls' items (code_interpreter_call, mcp_call, mcp_list_tools; see "
            "docs/responses.md)",
            param=f"{where}.type",
        )
    if kind not in KNOWN_KEYS and kind not in HOSTED_INPUT_TYPES:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not an input item type", param=f"{where}.type"
        )
    given = raw.get("id")
    if given is not None and (not isinstance(given, str) or not 0 < len(given) <= 64):
        raise InvalidRequest(
            f"{where}.id must be a string of 1 to 64 characters", param=f"{where}.id"
        )
    ident = given or new_id(ID_PREFIX[kind])
    if kind in HOSTED_INPUT_TYPES:
        return hosted_item(raw, where, ident)
    _no_unknown_keys(raw, KNOWN_KEYS[kind] | IGNORED_KEYS, where)
    if kind == "message":
        return _message(_role(raw, where), _content(raw, where), ident)
    if kind == "mcp_approval_response":
        return _approval(raw, where, ident)
    if kind == "compaction":
        text = _string(raw, "encrypted_content", where)
        if len(text) > MAX_COMPACTION_CHARS:
            raise InvalidRequest(
                f"{where}.encrypted_content is longer than {MAX_COMPACTION_CHARS} characters",
                param=f"{where}.encrypted_content",
            )
        return {"id": ident, "type": "compaction", "encrypted_content": text}
    call_id = _string(raw, "call_id", where)
    if kind == "function_call":
        return {
            "id": ident, "type": "function_call", "call_id": call_id,
            "name": _string(raw, "name", where), "arguments": _string(raw, "arguments", where, empty=True),
            "status": "completed",
        }  # fmt: skip
    return {
        "id": ident, "type": "function_call_output", "call_id": call_id,
        "output": _output(raw, where), "status": "completed",
    }  # fmt: skip


def _approval(raw: dict[str, Any], where: str, ident: str) -> dict[str, Any]:
    approve, reason = raw.get("approve"), raw.get("reason")
    if not isinstance(approve, bool):
        raise InvalidRequest(f"{where}.approve must be true or false", param=f"{where}.approve")
    if reason is not None and not isinstance(reason, str):
        raise InvalidRequest(f"{where}.reason must be a string", param=f"{where}.reason")
    return {
        "id": ident, "type": "mcp_approval_response",
        "approval_request_id": _string(raw, "approval_request_id", where), "approve": approve,
        "reason": reason,
    }  # fmt: skip


def _message(role: str, content: list[dict[str, Any]], ident: str | None) -> dict[str, Any]:
    return {
        "id": ident or new_id("msg"), "type": "message", "role": role, "status": "completed",
        "content": content,
    }  # fmt: skip


def _no_unknown_keys(raw: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(raw.keys() - allowed)
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]} is not a field of this item", param=f"{where}.{unknown[0]}"
        )


def _string(raw: dict[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or (not empty and not value):
        need = "a string" if empty else "a non-empty string"
        got = "missing" if value is None else f"got {type(value).__name__}"
        raise InvalidRequest(f"{where}.{key} must be {need} ({got})", param=f"{where}.{key}")
    return value


def _role(raw: dict[str, Any], where: str) -> str:
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRequest(
            f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})", param=f"{where}.role"
        )
    return str(role)


def _content(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Content as parts: ``input_text`` for user/system/developer, ``output_text`` (or
    ``refusal``) for assistant; a string becomes one such part."""
    role, content = raw["role"], raw.get("content")
    text_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [_part(text_type, content)]
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{where}.content must be a string or a list of content parts", param=f"{where}.content"
        )
    allowed = ("output_text", "refusal") if role == "assistant" else ("input_text",)
    return [_content_part(p, allowed, f"{where}.content[{j}]") for j, p in enumerate(content)]


def _content_part(part: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where} must be a content part object", param=where)
    kind = part.get("type")
    if kind in ("input_image", "input_file", "input_audio"):
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported yet: text parts only (docs/responses.md)",
            param=f"{where}.type",
        )
    if kind not in allowed:
        raise InvalidRequest(
            f"{where}.type must be {' or '.join(allowed)} for this role (got {kind!r})",
            param=f"{where}.type",
        )
    _no_unknown_keys(part, PART_KEYS, where)
    key = "refusal" if kind == "refusal" else "text"
    text = part.get(key)
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return {"type": "refusal", "refusal": text} if kind == "refusal" else _part(kind, text)


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": kind, "text": text}


def _output(raw: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    output = raw.get("output")
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise InvalidRequest(
            f"{where}.output must be a string or a list of input_text parts",
            param=f"{where}.output",
        )
    return [_content_part(p, ("input_text",), f"{where}.output[{j}]") for j, p in enumerate(output)]


# -- items -> chat messages ------------------------------------------------------


def to_messages(
    history: list[dict[str, Any]], inputs: list[dict[str, Any]], instructions: str | None
) -> list[dict[str, Any]]:
    """The chat messages for a chain's stored items followed by this request's inputs.

    ``instructions`` become the first (system) message; they are not carried along a
    chain, as with OpenAI. A function call's output must answer a call of the chain, and
    every call of the chain must have its output before the model runs again."""
    check_calls(history, inputs)
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    ran: list[dict[str, Any]] = []  # hosted calls' outputs, told after their assistant message
    # an approved (or denied) call's result, told with the request that asked for it (a
    # call sent back as input whose request is not in the chain is told as any other)
    asked = {i["id"] for i in (*history, *inputs) if i["type"] == "mcp_approval_request"}
    results = {
        i["approval_request_id"]: i for i in (*history, *inputs)
        if i["type"] == "mcp_call" and i.get("approval_request_id") in asked
    }  # fmt: skip
    for item in (*history, *inputs):
        kind = item["type"]
        if kind not in ("function_call", "mcp_approval_request", *HOSTED_ITEMS):
            out.extend(ran)
            ran.clear()
        if kind in ("mcp_list_tools", "mcp_approval_response") or (
            item.get("approval_request_id") in results
        ):
            continue  # no message: a listing, an answer, a result told with its request
        if kind == "mcp_approval_request":
            call, _ = replay(item)
            _add_call(out, call)
            if item["id"] in results:
                _, text = replay(results[item["id"]])
                ran.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        elif kind == "message":
            out.append({"role": item["role"], "content": _chat_content(item["content"])})
        elif kind == "compaction":  # the gateway's own summary (/v1/responses/compact)
            out.append({"role": "user", "content": COMPACTED + item["encrypted_content"]})
        elif kind == "function_call":
            _add_call(out, {
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })  # fmt: skip
        elif kind in HOSTED_ITEMS:  # the gateway ran it: the call and its output
            call, text = replay(item)
            _add_call(out, call)
            ran.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        else:
            output = item["output"]
            text = output if isinstance(output, str) else "".join(p["text"] for p in output)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return out + ran


def _add_call(out: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """One assistant message holds a step's text and all its tool calls, as the model said."""
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def tool_name(item: dict[str, Any]) -> str:
    """The sandbox tool (the function the model called) of a hosted call item."""
    return CODE_TOOL if item["type"] == "code_interpreter_call" else str(item["name"])


def replay(item: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A stored hosted call item as the chat tool call the model made and the output it
    was told (``call_id`` is the model's own id)."""
    if item["type"] == "code_interpreter_call":
        arguments = item.get("arguments") or orjson.dumps({"code": item.get("code") or ""}).decode()
        logs = (o.get("logs") for o in item.get("outputs") or () if isinstance(o, dict))
        text = "".join(t for t in logs if isinstance(t, str))
    else:
        arguments, text = item.get("arguments") or "", item.get("output") or ""
    call = {
        "id": item.get("call_id") or item["id"], "type": "function",
        "function": {"name": tool_name(item), "arguments": arguments},
    }  # fmt: skip
    return call, text


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    texts: list[str] = [p["text"] if p["type"] != "refusal" else p["refusal"] for p in parts]
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts]


def check_calls(history: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> None:
    """Every function_call_output answers an earlier call; no call is left unanswered."""
    open_calls: dict[str, str] = {}  # call id -> where it was made
    answered: set[str] = set()
    for i, item in enumerate((*history, *inputs)):
        j = i - len(history)  # index in this request's input (negative: the chain's)
        if item["type"] == "function_call":
            open_calls[item["call_id"]] = f"input[{j}]" if j >= 0 else "previous_response_id"
        elif item["type"] == "function_call_output":
            call = item["call_id"]
            if call not in open_calls and j >= 0:
                raise InvalidRequest(
                    f"no function_call with call_id {call!r} precedes this function_call_output",
                    param=f"input[{j}].call_id",
                )
            answered.add(call)
    missing = [(c, w) for c, w in open_calls.items() if c not in answered]
    if missing:
        call, where = missing[0]
        raise InvalidRequest(
            f"no function_call_output for call_id {call!r} (the function_call in {where}); "
            "send its output as a function_call_output input item",
            param="input",
        )
