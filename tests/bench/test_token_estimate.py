"""bench.token_estimate's request builder and error summary (the run itself needs the stack:
``python -m bench.token_estimate``, figures in docs/benchmarks.md)."""

import itertools

from bench.token_estimate import agent_sessions, anchoring, errors, growing_sessions
from router.tokens import DEFAULT, counts

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


def test_growing_sessions_resend_their_history_and_are_scored_per_step():
    sessions = growing_sessions(6, 0, TOOLS)
    assert sessions == growing_sessions(6, 0, TOOLS) and {odd for odd, _ in sessions} == {
        True,
        False,
    }
    for _, steps in sessions:
        assert len(steps) >= 3
        for before, after in itertools.pairwise(steps):
            assert after["messages"][: len(before["messages"])] == before["messages"]
    # a tier that counts odd text at twice the estimate: sized from the step before, only
    # what each step added is misjudged
    truth = [
        round(DEFAULT.estimate(body) * (2 if odd else 1))
        for odd, steps in sessions
        for body in steps
    ]
    found = anchoring(sessions, truth)
    assert found["plain_estimate"]["max"] == 0  # the tier counts what the estimate says
    assert found["plain_anchored"]["max"] < 0.05  # the appended messages estimated alone
    assert found["odd_estimate"]["median"] == 0.5
    assert found["odd_anchored"]["median"] < found["odd_estimate"]["median"]
    assert {"all_estimate", "all_anchored", "last_step_estimate", "last_step_anchored"} <= set(
        found
    )
