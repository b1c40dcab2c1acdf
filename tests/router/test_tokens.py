"""The prompt-token estimate: what the chat template adds is counted, and it stays cheap.

Its accuracy against the real tokenizer is measured where one runs: the default family's
fit in docs/router.md, and the gateway's calibration against vLLM's /tokenize in
tests/e2e/test_embedded_stack.py.
"""

from router.tokens import (
    DEFAULT,
    DIGIT_BUDGET,
    Anchor,
    Counts,
    TokenModel,
    anchored,
    counts,
    estimate_prompt_tokens,
    fingerprint,
    position,
)

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


def _session() -> list[dict[str, object]]:
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "data.bin"}'}}  # fmt: skip
    return [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Summarise data.bin."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "QUJD" * 2000},  # base64: dense
    ]


def test_a_session_step_is_sized_from_the_last_exact_count():
    """An agent resends its conversation: the next step is the last one's exact count plus
    the estimate of what was added, so the estimate's error on old text stops compounding."""
    first = {"messages": _session(), "tools": [TOOL]}
    where = position(first)
    assert where is not None
    exact = 2 * DEFAULT.estimate(first)  # the tier reads the blob as many more tokens
    anchor = Anchor(*where, counts(first), exact)
    appended = [{"role": "assistant", "content": "It holds ABC, repeated."},
                {"role": "user", "content": "Thanks. How long is it 2 decode?"}]  # fmt: skip
    second = {"messages": [*_session(), *appended], "tools": [TOOL]}
    # the appended messages as a conversation of their own, less the template's fixed part
    alone = DEFAULT.estimate({"messages": appended}) - (DEFAULT.base + DEFAULT.no_system)
    tokens, was_anchored = anchored(DEFAULT, counts(second), second, anchor)
    assert was_anchored and abs(tokens - (exact + alone)) <= 1 and 10 < alone < 50
    # retrying the anchored step itself gives its exact count back
    assert anchored(DEFAULT, counts(first), first, anchor) == (exact, True)
    # without an anchor it is the plain estimate, far off the count here
    assert anchored(DEFAULT, counts(second), second, None) == (DEFAULT.estimate(second), False)


def test_what_appended_messages_add_leaves_out_the_templates_fixed_parts():
    """``appended``: every weighted count but the system prompt's and the tools block's,
    which a conversation pays once (and base, which ``appended`` never adds)."""
    c = Counts(no_system=1.0, messages=3.0, chars=900.0, digits=40.0, symbols=120.0,
               tools=1.0, json_chars=300.0, calls=2.0, wide=7.0, token_ids=5)  # fmt: skip
    m = DEFAULT
    want = (m.per_message * 3 + m.per_char * 900 + m.per_digit * 40 + m.per_symbol * 120
            + m.per_json_char * 300 + m.per_call * 2 + m.per_wide_byte * 7)  # fmt: skip
    assert abs(m.appended(c) - want) < 1e-9
    assert c.vector() == [1.0, 1.0, 3.0, 900.0, 40.0, 120.0, 1.0, 300.0, 2.0, 7.0]
    assert m.appended(Counts()) == 0.0


def test_an_anchor_only_applies_to_the_conversation_it_counted():
    first = {"messages": _session()}
    where = position(first)
    assert where is not None
    anchor = Anchor(*where, counts(first), 5000)

    def applies(body: dict[str, object]) -> bool:
        return anchored(DEFAULT, counts(body), body, anchor)[1]

    other = _session()
    other[3] = {**other[3], "content": "a different result"}
    assert not applies({"messages": [*other, {"role": "user", "content": "go on"}]})
    assert not applies({"messages": _session()[:3]})  # compacted: fewer messages
    shifted = _session()
    del shifted[0]  # the history was cut at the front: the anchored message moved
    assert not applies({"messages": [*shifted, {"role": "user", "content": "go on"}]})
    assert not applies({"prompt": [1, 2, 3]})  # token ids are counted, not estimated
    assert not applies({"messages": "junk"}) and not applies({})
    # earlier text edited, the anchored message kept: what was counted is not a prefix
    edited = _session()
    edited[1] = {**edited[1], "content": "Summarise it."}
    assert not applies({"messages": [*edited, {"role": "user", "content": "go on"}]})
    # other tools offered: the system turn the tier counted changed
    assert not applies(
        {"messages": [*_session(), {"role": "user", "content": "go"}], "tools": [TOOL]}
    )
    assert applies({"messages": [*_session(), {"role": "user", "content": "go"}]})


def test_fingerprints_tell_messages_apart_cheaply():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hi"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "function": {"name": "g"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "hi"},
        {"role": "tool", "tool_call_id": "c2", "content": "hi"},
        {"role": "user", "content": "x" * 10_000 + "a"},
        {"role": "user", "content": "x" * 10_000 + "b"},
        {"role": "user", "content": "x" * 10_001},
    ]
    prints = [fingerprint(m) for m in messages]
    assert len(set(prints)) == len(prints)
    assert fingerprint({"role": "user", "content": "hi"}) == prints[0]
    assert fingerprint("junk") == fingerprint(None) == 0
    assert position({"messages": []}) is None and position({"prompt": "x"}) is None


def test_scripts_beyond_ascii_count_their_extra_bytes():
    """A tokenizer trained mostly on English reads Han, Kana, Cyrillic or emoji as several
    tokens a character; characters / a constant saw a tenth of that (bench.token_estimate:
    56% median error on eleven languages, 13.5% counting UTF-8 bytes beyond one a char)."""
    english = counts(user("The server restarts every night at two."))
    assert english.wide == 0
    chinese = counts(user("服务器每晚两点自动重启。"))  # 12 characters, 3 bytes each
    assert chinese.wide == 24 and chinese.chars == 12
    russian = counts(user("Сервер перезапускается каждую ночь."))
    assert russian.wide == sum(len(c.encode()) - 1 for c in "Сервер перезапускается каждую ночь.")
    assert counts(user("ok 🎉")).wide == 3
    # the estimate of the Chinese sentence now exceeds that of an English one three times longer
    assert estimate_prompt_tokens(user("服务器每晚两点自动重启。")) > estimate_prompt_tokens(
        user("The server restarts every night at two.")
    )
    # sampled like digits: the density of the latest text, scaled to the rest
    long = counts(user("汉" * 20_000))
    assert long.wide == 40_000 and long.chars == 20_000
