"""Step features and the rules policy: deterministic, explained, and configurable."""

from __future__ import annotations

import pytest

from router import PolicyError, RouteRequest, Tier, build_policy
from router.step_features import step_features


def chat(*messages: dict, **extra: object) -> dict:
    return {"model": "auto", "messages": list(messages), **extra}


USER = {"role": "user", "content": "What is the capital of France?"}


def test_features_of_a_tool_loop():
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
    }
    body = chat(
        USER,
        call,
        {"role": "tool", "tool_call_id": "1", "content": "Error: timeout"},
        tools=[{}, {}],
    )
    f = step_features(body)
    assert f["tool_loop_depth"] == 1 and f["last_tool_error"] == 1 and f["tools_offered"] == 2
    assert f["user_turns"] == 1 and f["messages"] == 3
    ok = step_features(chat(USER, call, {"role": "tool", "tool_call_id": "1", "content": "sunny"}))
    assert ok["last_tool_error"] == 0


def test_content_parts_without_string_text_are_read_as_no_text():
    # The gateway refuses such requests; the router must not fail on them either (it runs
    # for replayed and store-read bodies too).
    parts = [{"type": "text", "text": 2**63}, {"type": "image_url"}, {"type": "text", "text": "hi"}]
    f = step_features(chat({"role": "user", "content": parts}))
    assert f["messages"] == 1 and f["user_turns"] == 1


@pytest.mark.parametrize(
    ("text", "code", "math"),
    [
        ("Fix this:\n```python\nprint(1)\n```", 1, 0),
        ("def add(a, b): return a + b  -- why does it fail?", 1, 0),
        ("Prove that the sum of two even numbers is even.", 0, 1),
        ("Compute 17 * 23", 0, 1),
        ("What is the capital of France?", 0, 0),
    ],
)
def test_code_and_math_markers(text, code, math):
    f = step_features(chat({"role": "user", "content": text}))
    assert (f["code"], f["math"]) == (code, math)


@pytest.mark.parametrize(
    ("result", "failed"),
    [
        ("Error: no such file", True),
        ("   TRACEBACK (most recent call last):", True),
        ("permission denied", True),
        ('{"ok": false, "ERROR" :  "boom"}', True),
        ('{"error":1}', True),
        ("x" * 3000 + '"error": 1', False),  # past the first SCAN characters
        ("the error was fixed", False),
        ('{"errors": []}', False),
        ("", False),
    ],
)
def test_a_failed_tool_result(result, failed):
    tool = {"role": "tool", "tool_call_id": "c1", "content": result}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call]}]
    f = step_features({"messages": [*messages, tool]})
    assert f["last_tool_error"] == float(failed)


def test_client_asks():
    f = step_features(chat(USER, response_format={"type": "json_object"}, tool_choice="required",
                           max_tokens=64, reasoning_effort="high"))  # fmt: skip
    assert (f["structured_output"], f["forced_tool"], f["max_tokens"], f["reasoning_effort"]) == (
        1,
        1,
        64,
        2,
    )


def test_rules_force_full_and_explain_why():
    p = build_policy("rules")
    code = p.decide(RouteRequest("chat", chat({"role": "user", "content": "```\nx = 1\n```"})))
    assert (
        code.tier is Tier.FULL
        and code.reason.startswith("rule code")
        and code.features["code"] == 1
    )
    effort = p.decide(RouteRequest("chat", chat(USER, reasoning_effort="high")))
    assert effort.tier is Tier.FULL and "effort" in effort.reason
    plain = p.decide(RouteRequest("chat", chat(USER)))
    assert plain.tier is Tier.FAST and "no rule applied" in plain.reason
    assert plain.policy == "rules/length_threshold" and "prompt_tokens" in plain.features
    assert p.decide(RouteRequest("chat", chat(USER))) == plain  # deterministic


def test_rules_can_be_turned_off_and_wrap_any_base():
    p = build_policy("rules", {"code": False, "base": "always_full"})
    d = p.decide(RouteRequest("chat", chat({"role": "user", "content": "```x```"})))
    assert d.tier is Tier.FULL and "constant policy" in d.reason


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"code": "yes"}, "true or false"),
        ({"colour": 1}, "unknown parameters"),
        ({"base": "rules"}, "cannot be"),
    ],
)
def test_bad_parameters_fail_at_start_up(params, says):
    with pytest.raises(PolicyError, match=says):
        build_policy("rules", params)


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "read_file"}}
TOOL_CALL_REASON = (
    "rule tool_call: a forced tool call (the fast tier's calls agree 0.44 of the time)"
)


@pytest.mark.parametrize("choice", [NAMED, "required"])
def test_a_forced_tool_call_goes_to_full_with_the_measured_reason(choice):
    d = build_policy("rules", {"base": "always_fast"}).decide(
        RouteRequest("chat", chat(USER, tools=TOOLS, tool_choice=choice))
    )
    assert (d.tier, d.reason, d.policy) == (Tier.FULL, TOOL_CALL_REASON, "rules")
    assert d.features["forced_tool"] == 1


@pytest.mark.parametrize("extra", [{"tool_choice": "auto"}, {"tool_choice": "none"}, {}])
def test_a_step_that_may_answer_in_text_is_left_to_the_base(extra):
    p = build_policy("rules", {"base": "always_fast"})
    d = p.decide(RouteRequest("chat", chat(USER, tools=TOOLS, **extra)))
    assert d.tier is Tier.FAST and d.reason.endswith("(no rule applied)")


def test_the_forced_call_rule_has_an_off_switch_and_leaves_risky_tools_first():
    off = build_policy("rules", {"base": "always_fast", "tool_call": False})
    assert off.decide(RouteRequest("chat", chat(USER, tools=TOOLS, tool_choice=NAMED))).tier is Tier.FAST  # fmt: skip
    drop = [{"type": "function", "function": {"name": "drop_table"}}]
    risky = build_policy("rules", {"base": "always_fast"}).decide(
        RouteRequest("chat", chat(USER, tools=drop, tool_choice="required"))
    )
    assert risky.reason == "rule risky_tools: a destructive tool call may follow (drop_table)"
    with pytest.raises(PolicyError, match="rules: tool_call must be true or false"):
        build_policy("rules", {"tool_call": "no"})


def test_the_default_chain_sends_forced_calls_to_full():
    from gateway.config import DEFAULT_ROUTER_PARAMS

    chain = build_policy("session", DEFAULT_ROUTER_PARAMS)
    d = chain.decide(RouteRequest("chat", chat(USER, tools=TOOLS, tool_choice=NAMED)))
    assert d.tier is Tier.FULL and d.reason.startswith("rule tool_call")
    off = {**DEFAULT_ROUTER_PARAMS, "base_params": {**DEFAULT_ROUTER_PARAMS["base_params"], "tool_call": False}}  # fmt: skip
    d = build_policy("session", off).decide(RouteRequest("chat", chat(USER, tools=TOOLS, tool_choice=NAMED)))  # fmt: skip
    assert not d.reason.startswith("rule tool_call")
