"""Check a tool call's arguments against the JSON schema the request offered for that tool.

Covers the part of JSON Schema that function definitions use in practice:
``type`` (one or a list), ``required``, ``properties``, ``additionalProperties:
false``, ``enum`` and ``items``. Anything else is accepted: a false "invalid"
would cost a needless escalation or a wrong reward, a missed exotic keyword
costs nothing here.
"""

from __future__ import annotations

from typing import Any

import orjson

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def tool_schemas(tools: Any) -> dict[str, dict[str, Any]]:
    """Map tool name to its parameters schema from a request's ``tools`` list."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def check_call(name: str, arguments: str, schemas: dict[str, dict[str, Any]]) -> str | None:
    """None when the call is valid, else why not (one line)."""
    if name not in schemas:
        return f"tool {name!r} was not offered"
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        return f"arguments are not valid JSON: {exc}"
    return check_value(args, schemas[name], "arguments")


def check_value(value: Any, schema: dict[str, Any], where: str) -> str | None:
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        allowed = tuple(t for k in kinds for t in _TYPES.get(k, (object,)))
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and bool not in allowed):
            return f"{where} should be {' or '.join(map(str, kinds))}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} should be one of {schema['enum']}"
    if isinstance(value, dict):
        return _check_object(value, schema, where)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = check_value(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None


def _check_object(value: dict[str, Any], schema: dict[str, Any], where: str) -> str | None:
    props = schema.get("properties") or {}
    for key in schema.get("required") or ():
        if key not in value:
            return f"{where} lacks the required {key!r}"
    for key, item in value.items():
        if key in props and isinstance(props[key], dict):
            problem = check_value(item, props[key], f"{where}.{key}")
            if problem:
                return problem
        elif schema.get("additionalProperties") is False:
            return f"{where} has {key!r}, which the schema does not allow"
    return None
