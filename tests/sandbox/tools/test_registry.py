"""The tool registry: what each tool asks the policy, and the warm flag."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.policy import Request
from sandbox.tools.registry import TOOLS


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("run_python", {"code": "1"}, Request("run_python", ".", True)),
        ("run_shell", {"command": "ls"}, Request("run_shell", ".", True)),
        ("read_file", {"path": "src/a.py"}, Request("read_file", "src/a.py", True)),
        ("write_file", {"path": "../x", "content": ""}, Request("write_file", "../x", True)),
        ("list_dir", {}, Request("list_dir", ".", True)),
        ("list_dir", {"path": ""}, Request("list_dir", ".", True)),
        ("http_fetch", {"url": "https://api.example.com/v1"},
         Request("http_fetch", approved=True, host="api.example.com", port=443)),
        ("http_fetch", {"url": "http://h:8080/"}, Request("http_fetch", approved=True, host="h", port=8080)),
        ("http_fetch", {"url": "file:///etc/passwd"}, Request("http_fetch", approved=True)),
        ("sql_query", {"database": "shop", "query": "select 1"},
         Request("sql_query", approved=True, database="shop")),
    ],
)  # fmt: skip
def test_each_tool_asks_the_policy_about_its_target(
    tool: str, arguments: dict[str, Any], expected: Request
):
    assert TOOLS[tool].policy_request(arguments, True) == expected


def test_only_the_process_tools_use_the_resident_interpreter():
    assert {name for name, t in TOOLS.items() if t.warm} == {"run_python", "run_shell"}


def test_every_schema_forbids_unknown_arguments():
    for tool in TOOLS.values():
        assert tool.parameters["additionalProperties"] is False
        assert tool.schema()["function"]["name"] == tool.name
