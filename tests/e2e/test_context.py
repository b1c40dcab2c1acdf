"""Context management on the real stack: a session longer than the tier's window, which
vLLM refuses as it is, completes once the gateway condenses it; the window comes from the
replica's /v1/models, the count near the budget from its /tokenize, the summary from the
real fast tier."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.test_embedded_stack import FULL
from tests.gateway.pipeline.context.agent import chat, session, step

pytestmark = pytest.mark.e2e
AUTO = {"x-gearshift-context": "auto"}
WINDOW = 4096  # embedded.max_model_len


def fields(header: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in header.split(", "))


def masked_or_to_the_mark(done: dict[str, str]) -> bool:
    """The ten long outputs masked and nothing summarized; or, where that leaves the request
    above half its budget (the tier's count decides), the oldest turns summarized
    extractively to reach it (``summarize_to_mark``: no model call)."""
    masked = int(done["masked"]) == 10 and done["summarized"] == "0"
    return masked or (done.get("summarizer") == "extractive" and int(done["summarized"]) > 0)


def test_a_tool_session_longer_than_the_window_completes_masked(real_stack):
    client = real_stack.client().with_options(timeout=600)  # CPU prefill on a busy machine
    # long early outputs, short latest ones: masking alone brings it under a small budget
    messages = session(10, chars=4000)
    messages += [m for i in range(10, 13) for m in step(i, 300)]
    with pytest.raises(openai.BadRequestError):  # as it is: longer than the window
        client.chat.completions.create(model=FULL, messages=messages, max_tokens=8)
    raw = client.chat.completions.with_raw_response.create(
        model=FULL, messages=messages, max_tokens=8, temperature=0,
        extra_headers={**AUTO, "x-gearshift-context-budget": "2000"},
    )  # fmt: skip
    answer = raw.parse()
    header = raw.headers["x-gearshift-context"]
    done = fields(header)
    assert masked_or_to_the_mark(done) and int(done["tokens_before"]) > WINDOW, header
    assert answer.usage.prompt_tokens <= 2000, header
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_a_long_chat_is_summarized_by_the_fast_tier_and_completes(real_stack):
    client = real_stack.client().with_options(timeout=600)
    messages = chat(10, chars=600)  # no tool output to mask
    raw = client.chat.completions.with_raw_response.create(
        model=FULL, messages=messages, max_tokens=8, temperature=0,
        extra_headers={**AUTO, "x-gearshift-context-budget": "2500"},
    )  # fmt: skip
    header = raw.headers["x-gearshift-context"]
    done = fields(header)
    assert int(done["summarized"]) > 0, header
    # extractive when the fast tier took longer than summary_timeout_s (a busy CPU)
    assert done["summarizer"] in ("fast", "extractive"), header
    assert raw.parse().usage.prompt_tokens <= 2500, header


def test_a_responses_call_longer_than_the_window_completes_with_truncation_auto(real_stack):
    client = real_stack.client().with_options(timeout=600)
    items: list[dict[str, object]] = [{"role": "user", "content": "Find why the tests fail."}]
    for i in range(13):  # long early outputs, short latest ones, as in the chat test
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "run_shell",
                      "arguments": f'{{"cmd": "cat part_{i}.txt"}}'})  # fmt: skip
        chars = 4000 if i < 10 else 300
        items.append({"type": "function_call_output", "call_id": f"call_{i}",
                      "output": step(i, chars)[1]["content"]})  # fmt: skip
    with pytest.raises(openai.BadRequestError):  # as it is: longer than the window
        client.responses.create(model=FULL, input=items, max_output_tokens=8)
    raw = client.responses.with_raw_response.create(
        model=FULL, input=items, max_output_tokens=8, temperature=0, truncation="auto",
        extra_headers={"x-gearshift-context-budget": "2000"},
    )  # fmt: skip
    done = fields(raw.headers["x-gearshift-context"])
    assert masked_or_to_the_mark(done) and int(done["tokens_before"]) > WINDOW, done
    response = raw.parse()
    assert response.truncation == "auto" and response.status in ("completed", "incomplete")
    assert response.usage is not None and response.usage.input_tokens <= 2000
