"""End to end: the official ``openai`` SDK's Responses API against ``gearshift serve`` over
real vLLM servers, the embedded sandbox (bubblewrap) and the SQLite store.

Cheap on purpose: every answer is capped at a few tokens and each test runs one to three
model steps. The default model only calls a tool when the request forces it
(``tool_choice``), so every tool step here is forced.
"""

from __future__ import annotations

import shutil
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.test_embedded_stack import FAST, FULL, WEATHER_TOOL

pytestmark = pytest.mark.e2e

WEATHER: Any = {"type": "function", **WEATHER_TOOL["function"]}  # the Responses shape
CODE: Any = {"type": "code_interpreter", "container": {"type": "auto"}}
FORCE_CODE: Any = {"type": "code_interpreter"}
# The small model writes its calls in the chat template's Hermes form; left to itself it
# writes long code, so the prompt shows it the exact call(s) to make.
CALL = '<tool_call>\n{{"name": "run_python", "arguments": {{"code": "{}"}}}}\n</tool_call>'
COPY = "Reply with exactly this and nothing else:\n"
CODE_TASK = COPY + CALL.format("print(6*7)")
TIERS = ("full", "fast")


def session(stack: Any, name: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.url}/v1/sessions/{name}", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def detokenize(stack: Any, ids: list[int]) -> str:
    """The text of token ids, by the tier's own tokenizer (both tiers share it)."""
    r = httpx.post(f"{stack.full_url}/detokenize", json={"model": FULL, "tokens": ids}, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["prompt"])


@pytest.fixture(scope="module")
def sandboxed(real_stack: Any) -> Any:
    """The stack, once its sandbox runs code (bubblewrap, as root)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: the embedded sandbox cannot start")
    listing = httpx.get(f"{real_stack.url}/v1/tools", timeout=30)
    if listing.status_code == 503:
        pytest.skip(f"the embedded sandbox is not running here: {listing.text}")
    return real_stack


def test_create_retrieve_delete(real_stack):
    client = real_stack.client()
    raw = client.responses.with_raw_response.create(
        model="auto", input="Say hello.", max_output_tokens=8, temperature=0
    )
    r = raw.parse()
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text.strip() and r.model in (FULL, FAST)
    assert r.usage is not None and 0 < r.usage.output_tokens <= 8
    assert raw.headers["x-gearshift-tier"] in TIERS
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
    (item,) = client.responses.input_items.list(r.id).data
    assert item.type == "message" and item.role == "user"  # type: ignore[union-attr]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_stream_events_in_order(real_stack):
    client = real_stack.client()
    events = list(
        client.responses.create(
            model=FULL, input="Say hello.", max_output_tokens=8, temperature=0, stream=True
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * deltas,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        kinds[-1],
    ]  # fmt: skip
    assert kinds[-1] in ("response.completed", "response.incomplete")
    end = events[-1].response  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert end.output_text == text
    assert client.responses.retrieve(end.id).model_dump() == end.model_dump()  # stored


def test_previous_response_id_over_three_turns_with_a_client_function_call(real_stack):
    client = real_stack.client()
    first = client.responses.create(
        model="auto", input="What is the weather in Paris?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40,
        temperature=0,
    )  # fmt: skip
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments.startswith("{") and first.status == "completed"
    second = client.responses.create(
        model="auto", previous_response_id=first.id, tools=[WEATHER], max_output_tokens=12,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
        temperature=0,
    )  # fmt: skip
    third = client.responses.create(
        model="auto", previous_response_id=second.id, input="And in Rome?",
        max_output_tokens=8, temperature=0,
    )  # fmt: skip
    assert second.output_text.strip() and third.output_text.strip()
    # one trajectory session, named after the chain's first response, one step a turn
    steps = session(real_stack, first.id)["steps"]
    assert [s["seq"] for s in steps] == [0, 1, 2]
    assert all(s["tier"] in TIERS and s["completion_token_ids"] for s in steps)
    # the last turn's prompt holds the whole chain: the call, its output, both answers
    prompt = detokenize(real_stack, steps[2]["prompt_token_ids"])
    for seen in ("weather in Paris", "get_weather", "18C", second.output_text, "And in Rome?"):
        assert seen.strip() in prompt


def test_a_forced_code_interpreter_call_runs_in_the_sandbox_and_the_model_sees_it(sandboxed):
    client = sandboxed.client()
    # the full tier: the pruned fast tier copies the shown call less faithfully, and this
    # test is about the hosted loop and the sandbox, not the model's copying
    r = client.responses.create(
        model=FULL, input=CODE_TASK, tools=[CODE], tool_choice=FORCE_CODE,
        max_output_tokens=64, temperature=0,
    )  # fmt: skip
    ci = r.output[0]
    assert ci.type == "code_interpreter_call" and ci.status == "completed"
    assert ci.code == "print(6*7)" and ci.container_id == r.id and ci.outputs
    logs = ci.outputs[0].logs  # type: ignore[union-attr]
    assert logs == "42\n"  # printed in the sandbox
    # two model steps: the forced call, then the answer that saw the call's output
    assert r.output[-1].type == "message"
    steps = session(sandboxed, r.id)["steps"]
    assert [s["seq"] for s in steps] == [0, 1]
    assert all(s["tier"] in TIERS and s["completion_token_ids"] for s in steps)
    assert logs.strip() in detokenize(sandboxed, steps[1]["prompt_token_ids"])
    rewards = {(w["scope"], w["name"]) for w in session(sandboxed, r.id)["rewards"]}
    assert ("tool_call", "tool_success") in rewards  # the sandbox's attested result
