"""The prompt-token estimate: what the chat template adds is counted, and it stays cheap.

Its accuracy against the real tokenizer is measured where one runs: the default family's
fit in docs/router.md, and the gateway's calibration against vLLM's /tokenize in
tests/e2e/test_embedded_stack.py.
"""

from router.tokens import DEFAULT, DIGIT_BUDGET, Counts, TokenModel, counts, estimate_prompt_tokens

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city, with the temperature in Celsius",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def user(text: str, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_what_the_template_adds_is_counted():
    bare = estimate_prompt_tokens(user("What is the weather in Paris?"))
    with_tools = estimate_prompt_tokens(user("What is the weather in Paris?", tools=[TOOL] * 5))
    # a question with five tool schemas is mostly schema: characters / 4 saw 7 tokens
    assert with_tools > 4 * bare > 4 * 7
    system = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    }
    assert counts(system).no_system == 0 and counts(user("Hi")).no_system == 1
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    loop = user("Weather?")["messages"] + [  # type: ignore[operator]
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, clear"},
    ]
    c = counts({"messages": loop})
    assert (c.messages, c.calls) == (1, 1)  # the call's message and its result count with the call
    assert c.json_chars == len("get_weather") + len('{"city": "Paris"}')
    assert estimate_prompt_tokens({"messages": loop}) > estimate_prompt_tokens(user("Weather?"))


def test_digits_cost_more_than_letters():
    # this family's tokenizer splits numbers into single digits
    assert estimate_prompt_tokens(user("1234567890" * 20)) > 2 * estimate_prompt_tokens(
        user("abcdefghij" * 20)
    )


def test_digits_are_counted_in_the_latest_text_and_scaled():
    long = "7" * (10 * DIGIT_BUDGET)
    assert counts(user(long)).digits == len(long)
    mixed = "12345 abcde " * 10_000
    exact = sum(ch.isdigit() for ch in mixed)
    assert abs(counts(user(mixed)).digits - exact) / exact < 0.02
    # an old tool output full of numbers, then recent prose: the density of the latest text
    history = [
        {"role": "tool", "content": "1234567890" * 2000},
        *[{"role": "user", "content": "x" * 9000}],
    ]
    assert counts({"messages": history}).digits < 0.1 * 20_000


def test_linear_in_its_counts():
    model = TokenModel(base=1, no_system=2, per_message=3, per_char=0.5, per_digit=1, per_symbol=0, tools=10,
                       per_json_char=0.25, per_call=7, source="test")  # fmt: skip
    body = {"messages": [{"role": "user", "content": "ab12"}], "tools": [{"type": "function"}]}
    c = counts(body)
    assert c == Counts(
        no_system=1, messages=1, chars=4, digits=2, tools=1, json_chars=len('{"type": "function"}')
    )
    assert model.estimate(body) == round(1 + 2 + 3 + 0.5 * 4 + 2 + 10 + 0.25 * c.json_chars)
    assert TokenModel.from_weights(model.weights(), "x").weights() == model.weights()


def nested(depth: int) -> dict[str, object]:
    node: dict[str, object] = {}
    for _ in range(depth):
        node = {"a": node}
    return node


def test_hostile_shapes_are_counted_or_ignored_never_raise():
    odd = [
        {"messages": [None, 3, {"role": "user", "content": [{"text": 5}, "x", None]}]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [None, {"function": "f"}, {"function": {"name": 3}}],
                }
            ]
        },
        {"messages": [{"role": "assistant", "tool_calls": "call"}], "tools": "all of them"},
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": {"x": {1}}}}],
                }
            ]
        },
        {"prompt": [None, 1.5, "x"]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [nested(5000)]},
        {"messages": [{"role": "user", "content": "\ud800 lone surrogate 42"}]},
    ]
    for body in odd:
        assert estimate_prompt_tokens(body) >= 0


def test_huge_tool_lists_are_sampled_not_ignored():
    few = DEFAULT.estimate(user("hi", tools=[TOOL] * 10))
    many = DEFAULT.estimate(user("hi", tools=[TOOL] * 5_000))  # 64 serialized, scaled to 5,000
    per_tool = (few - DEFAULT.estimate(user("hi", tools=[TOOL]))) / 9
    assert abs((many - few) / per_tool - 4_990) < 5
