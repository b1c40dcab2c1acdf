"""The one tool-argument checker: the gateway's check of a model's tool calls against the
request's schemas, and the sandbox's check of every call it runs."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.tools.registry import TOOLS
from sandbox.toolschema import check_call, check_value, tool_schemas

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "scale": {"type": "number"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {
            "type": "object",
            "properties": {"lat": {"type": "number"}},
            "required": ["lat"],
            "additionalProperties": False,
        },
        "note": {"type": ["string", "null"]},
        "raw": {},
    },
    "required": ["city"],
    "additionalProperties": False,
}
SCHEMAS = {"weather": WEATHER, "anything": {}}


def test_tool_schemas_maps_each_offered_function_to_its_parameters():
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "bare"}},
        {"type": "function", "function": {"name": "odd", "parameters": "nope"}},
        {"type": "function", "function": {"parameters": WEATHER}},  # no name: skipped
        "not a tool",
        {"type": "function"},
    ]
    assert tool_schemas(tools) == {"weather": WEATHER, "bare": {}, "odd": {}}


@pytest.mark.parametrize("tools", [None, [], {}, 5, "weather"])
def test_tool_schemas_of_no_or_malformed_tools_is_empty(tools: Any):
    assert tool_schemas(tools) == {}


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("weather", '{"city": "Oslo"}', None),
        ("anything", "", None),  # empty arguments are {}
        ("anything", '{"x": [1, {"y": 2}]}', None),
        ("nope", "{}", "tool 'nope' was not offered"),
        ("weather", '{"city": ', "arguments are not valid JSON"),
        ("weather", "{}", "arguments lacks the required 'city'"),
        ("weather", '{"city": 3}', "arguments.city should be string"),
    ],
)
def test_check_call(name: str, arguments: str, problem: str | None):
    got = check_call(name, arguments, SCHEMAS)
    if problem is None:
        assert got is None
    else:
        assert got is not None and got.startswith(problem), got


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"city": "Oslo", "days": 3, "scale": 1.5, "unit": "c", "tags": ["a"], "note": None,
          "where": {"lat": 59.9}, "raw": {"any": "thing"}}, None),
        ({"city": "Oslo", "scale": 2}, None),  # an integer is a number
        ({"city": "Oslo", "note": "hi"}, None),
        ({}, "a lacks the required 'city'"),
        ({"city": "Oslo", "extra": 1}, "a has 'extra', which the schema does not allow"),
        ({"city": True}, "a.city should be string"),
        ({"city": "Oslo", "days": True}, "a.days should be integer"),  # a bool is no integer
        ({"city": "Oslo", "scale": False}, "a.scale should be number"),  # nor a number
        ({"city": "Oslo", "days": 1.5}, "a.days should be integer"),
        ({"city": "Oslo", "unit": "k"}, "a.unit should be one of ['c', 'f']"),
        ({"city": "Oslo", "tags": ["a", 2]}, "a.tags[1] should be string"),
        ({"city": "Oslo", "where": {}}, "a.where lacks the required 'lat'"),
        ({"city": "Oslo", "where": {"lat": 1, "lon": 2}}, "a.where has 'lon', which the schema does not allow"),
        ({"city": "Oslo", "note": 5}, "a.note should be string or null"),
        ([], "a should be object"),
    ],
)  # fmt: skip
def test_check_value(value: Any, problem: str | None):
    assert check_value(value, WEATHER, "a") == problem


def test_booleans_are_checked_as_booleans():
    schema = {"type": "boolean"}
    assert check_value(True, schema, "b") is None
    assert check_value(1, schema, "b") == "b should be boolean"


def test_unknown_properties_are_allowed_unless_the_schema_forbids_them():
    open_schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert check_value({"a": "x", "b": 1}, open_schema, "v") is None
    assert check_value({"b": 1}, {**open_schema, "additionalProperties": False}, "v") is not None


@pytest.mark.parametrize(
    "schema",
    [
        {"type": {"not": "a name"}},
        {"type": "decimal"},  # not a JSON Schema type: not checked
        {"type": []},
        {"enum": "abc"},
        {"required": "city"},
        {"required": [["city"]]},
        {"properties": ["city"], "additionalProperties": False},
        {"items": "string"},
    ],
)
def test_malformed_schemas_accept_rather_than_crash(schema: dict[str, Any]):
    # the schemas come from requests: a broken one must not fail the caller's request
    for value in ({"city": 1}, [1, "a"], 5):
        problem = check_value(value, schema, "v")
        assert problem is None or "does not allow" in problem


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_sandbox_tools_schemas_are_checked_by_the_same_checker(tool: str):
    params = TOOLS[tool].parameters
    valid = {key: "x" for key in params["required"]}
    assert check_value(valid, params, tool) is None
    assert check_value({**valid, "bogus": "x"}, params, tool) == (
        f"{tool} has 'bogus', which the schema does not allow"
    )
    for key in params["required"]:
        assert check_value({**valid, key: 1}, params, tool) == f"{tool}.{key} should be string"
