"""Risk classes of pending tool calls, and the rule that sends mutating/destructive ones to full."""

from __future__ import annotations

import pytest

from router import PolicyError, RouteRequest, Tier, build_policy
from router.risk import classify, pending


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("name", "risk"),
    [
        ("delete_branch", "destructive"), ("deleteUser", "destructive"), ("run_shell", "destructive"),
        ("run_python", "destructive"), ("send_email", "mutating"), ("UpdateRecord", "mutating"),
        ("write_file", "mutating"), ("http_fetch", "egress"), ("get_weather", "read-only"),
        ("get_book", "read-only"), ("math.factorial", "read-only"), ("", "read-only"),
    ],
)  # fmt: skip
def test_classes_from_hosted_tools_and_verbs(name: str, risk: str):
    assert classify(name) == risk


def test_overrides_win():
    assert classify("archive_ticket", {"archive_ticket": "mutating"}) == "mutating"
    assert classify("delete_cache", {"delete_cache": "read-only"}) == "read-only"


def test_pending_call_is_the_named_choice_or_the_riskiest_offered():
    tools = [tool("get_weather"), tool("send_email"), tool("drop_table")]
    assert pending({"tools": tools}) == ("destructive", "drop_table")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert pending({"tools": tools, "tool_choice": named}) == ("read-only", "get_weather")
    assert pending({"tools": tools, "tool_choice": "none"}) is None
    assert pending({"messages": []}) is None
    assert pending({"tools": "junk"}) is None and pending({"tools": [1, {}]}) is None


def test_without_offered_only_a_forced_call_counts():
    tools = [tool("get_weather"), tool("drop_table")]
    assert pending({"tools": tools}, offered=False) is None
    assert pending({"tools": tools, "tool_choice": "auto"}, offered=False) is None
    assert pending({"tools": tools, "tool_choice": "required"}, offered=False) == ("destructive", "drop_table")  # fmt: skip
    named = {"type": "function", "function": {"name": "drop_table"}}
    assert pending({"tools": tools, "tool_choice": named}, offered=False) == ("destructive", "drop_table")  # fmt: skip


def test_rules_send_forced_risky_calls_to_full_and_say_which_tool():
    alone = {"base": "always_fast", "tool_call": False}  # the risk rule without the forced-call one
    policy = build_policy("rules", alone)
    offered = {"messages": [{"role": "user", "content": "clean up"}], "tools": [tool("delete_branch")]}  # fmt: skip
    # an agent that is merely offered a destructive tool is not forced to full by default
    assert policy.decide(RouteRequest("chat", offered)).tier is Tier.FAST
    forced = {**offered, "tool_choice": {"type": "function", "function": {"name": "delete_branch"}}}
    d = policy.decide(RouteRequest("chat", forced))
    assert d.tier is Tier.FULL
    assert d.reason == "rule risky_tools: a destructive tool call may follow (delete_branch)"
    required = {**offered, "tool_choice": "required"}
    assert policy.decide(RouteRequest("chat", required)).tier is Tier.FULL
    safe = {**required, "tools": [tool("get_weather")]}
    assert policy.decide(RouteRequest("chat", safe)).tier is Tier.FAST
    off = build_policy("rules", {**alone, "risky_tools": False})
    assert off.decide(RouteRequest("chat", forced)).tier is Tier.FAST
    annotated = build_policy("rules", {**alone, "risk": {"get_weather": "mutating"}})
    assert annotated.decide(RouteRequest("chat", safe)).tier is Tier.FULL


def test_risky_offered_is_opt_in():
    policy = build_policy("rules", {"base": "always_fast", "risky_offered": True})
    offered = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool("delete_branch")]}
    assert policy.decide(RouteRequest("chat", offered)).tier is Tier.FULL
    with pytest.raises(PolicyError, match="risky_offered"):
        build_policy("rules", {"risky_offered": "yes"})


def test_bad_risk_map_is_named():
    with pytest.raises(
        PolicyError, match="rules: risk must be a map of tool names to one of read-only, egress"
    ):
        build_policy("rules", {"risk": {"x": "scary"}})
