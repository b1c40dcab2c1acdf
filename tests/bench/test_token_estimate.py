"""bench.token_estimate's request builder and error summary (the run itself needs the stack:
``python -m bench.token_estimate``, figures in docs/benchmarks.md)."""

from bench.token_estimate import agent_sessions, errors
from router.tokens import counts

TOOLS = [[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]]


def test_agent_sessions_are_deterministic_and_varied():
    first, again = agent_sessions(40, 0, TOOLS), agent_sessions(40, 0, TOOLS)
    assert first == again and agent_sessions(40, 1, TOOLS) != first
    shapes = [counts(b) for b in first]
    assert len({c.calls for c in shapes}) >= 4  # tool loops of different depths
    assert {c.no_system for c in shapes} == {0.0, 1.0} and {c.tools for c in shapes} == {0.0, 1.0}
    for body in first:
        roles = [m["role"] for m in body["messages"]]
        assert "user" in roles
        for i, m in enumerate(body["messages"]):
            if m["role"] == "tool":  # every result answers the call just before it
                assert body["messages"][i - 1]["tool_calls"][0]["id"] == m["tool_call_id"]


def test_errors_are_relative_and_ordered():
    e = errors([110, 90, 100, 300], [100, 100, 100, 100])
    assert e == {"median": 0.1, "p90": 0.1, "max": 2.0}
