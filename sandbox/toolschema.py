"""Check a tool call's arguments against the tool's JSON schema: the gateway checks a model's
tool calls against the schemas its request offered, the sandbox checks every call it runs.

Covers the part of JSON Schema that function definitions use in practice: ``type`` (one or
a list; booleans are not integers or numbers), ``required``, ``properties``,
``additionalProperties: false``, ``enum`` and ``items``. Anything else is accepted, and so
are malformed keywords (the schemas come from requests): a false "invalid" would cost a
needless escalation or a wrong reward, a missed exotic keyword costs nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    for t in tools if isinstance(tools, list | tuple) else ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def check_call(name: str, arguments: str, schemas: Mapping[str, dict[str, Any]]) -> str | None:
    """None when the call is valid, else why not (one line). ``arguments`` is the JSON text."""
    if name not in schemas:
        return f"tool {name!r} was not offered"
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        return f"arguments are not valid JSON: {exc}"
    return check_value(args, schemas[name], "arguments")


def check_value(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    """None when ``value`` fits ``schema``, else why not, naming the part (``where.key[i]``)."""
    problem = _check_type(value, schema.get("type"), where)
    if problem is None and isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        problem = f"{where} should be one of {schema['enum']}"
    if problem is None and isinstance(value, dict):
        problem = _check_object(value, schema, where)
    if problem is None and isinstance(value, list) and isinstance(schema.get("items"), dict):
        problem = _check_items(value, schema["items"], where)
    return problem


def _check_type(value: Any, kind: Any, where: str) -> str | None:
    if kind is None:
        return None
    kinds = kind if isinstance(kind, list) else [kind]
    allowed = tuple(t for k in kinds for t in _types(k))
    if not allowed:  # "type": [] names nothing to check against
        return None
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        return f"{where} should be {' or '.join(map(str, kinds))}"
    return None


def _types(kind: Any) -> tuple[type, ...]:
    """The Python types a JSON Schema type name admits: anything, for a name it does not know."""
    return _TYPES.get(kind, (object,)) if isinstance(kind, str) else (object,)


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], where: str) -> str | None:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    for key in required if isinstance(required, list) else ():
        if isinstance(key, str) and key not in value:
            return f"{where} lacks the required {key!r}"
    for key, item in value.items():
        if isinstance(props.get(key), dict):
            problem = check_value(item, props[key], f"{where}.{key}")
            if problem:
                return problem
        elif schema.get("additionalProperties") is False:
            return f"{where} has {key!r}, which the schema does not allow"
    return None


def _check_items(value: list[Any], items: Mapping[str, Any], where: str) -> str | None:
    for i, item in enumerate(value):
        problem = check_value(item, items, f"{where}[{i}]")
        if problem:
            return problem
    return None
