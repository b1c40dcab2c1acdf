"""The gateway answers as vLLM does: for each set of parameters a client may send, the
gateway's answer (recording on, pinned to the full tier) equals the full tier's vLLM
server's answer to the same body, but for the documented differences below.

Recording adds ``return_token_ids`` and ``logprobs`` to every upstream request and a stream
asks for its usage chunk; what these change in vLLM's answers is undone by the gateway
(``gateway.recording.capture``), and this file is the rule that says it was.

Documented differences (everything else must be equal):

* ``id`` and ``created`` of the answer and of each stream chunk: new per request;
* a tool call's ``id`` (vLLM draws a random one per call);
* stream chunk boundaries: vLLM may put several tokens in one chunk when its API server
  lags behind the engine, so streams are compared by their texts, the ordered field names
  of each choice's chunks (consecutive repeats merged), their log-probabilities, finish
  reasons and usage chunk, not chunk by chunk.

The two requests of a case go one after the other, never together: greedy outputs of vLLM
on CPU can differ between two runs only through batching.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.test_embedded_stack import FULL, WEATHER_TOOL

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
CHAT = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "seed": 7}
TEXT = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "seed": 7}
SAMPLED = {"temperature": 0.8, "seed": 7}  # vLLM refuses n > 1 with greedy sampling
FORCED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
}

TWO = [PROMPT, "Two plus two is"]
TOOL = {"messages": WEATHER, "tools": [WEATHER_TOOL], "max_tokens": 24}
CONTINUE = {
    "echo": True,
    "add_generation_prompt": False,
    "continue_final_message": True,
    "messages": [*MESSAGES, {"role": "assistant", "content": "The capital is"}],
}
STREAM = {"stream": True}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
EVERY = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
CONTINUOUS = {"stream": True, "stream_options": {"continuous_usage_stats": True}}  # no usage

# id, endpoint, body (but for model): the parameter sets a client may send
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("text", "completions", TEXT),
    ("text-echo", "completions", {**TEXT, "echo": True}),
    ("text-echo-logprobs0", "completions", {**TEXT, "echo": True, "logprobs": 0}),
    ("text-echo-logprobs2", "completions", {**TEXT, "echo": True, "logprobs": 2}),
    ("text-echo-token-ids", "completions", {**TEXT, "echo": True, "return_token_ids": True}),
    ("text-echo-max0", "completions", {**TEXT, "echo": True, "max_tokens": 0}),
    ("text-echo-max0-logprobs", "completions",
     {**TEXT, "echo": True, "max_tokens": 0, "logprobs": 1}),
    ("text-echo-prompt-logprobs", "completions", {**TEXT, "echo": True, "prompt_logprobs": 1}),
    ("text-echo-batch", "completions", {**TEXT, "echo": True, "prompt": TWO}),
    ("text-echo-n2", "completions", {**TEXT, **SAMPLED, "echo": True, "n": 2}),
    ("text-echo-token-prompt", "completions", {**TEXT, "echo": True, "prompt": [504, 3575, 282]}),
    ("text-logprobs3", "completions", {**TEXT, "logprobs": 3}),
    ("text-prompt-logprobs", "completions", {**TEXT, "prompt_logprobs": 2}),
    ("text-n2", "completions", {**TEXT, **SAMPLED, "n": 2}),
    ("text-stop", "completions", {**TEXT, "stop": ["."], "max_tokens": 16}),
    ("text-token-ids", "completions", {**TEXT, "return_token_ids": True}),
    ("text-suffix", "completions", {**TEXT, "suffix": " and that is all."}),
    ("text-echo-suffix", "completions", {**TEXT, "echo": True, "suffix": " and that is all."}),
    ("text-logprob-ids-alone", "completions", {**TEXT, "logprob_token_ids": [7042]}),
    ("text-beam", "completions", {**TEXT, "use_beam_search": True, "n": 2, "max_tokens": 4}),
    ("text-beam-echo", "completions",
     {**TEXT, "use_beam_search": True, "n": 2, "max_tokens": 4, "echo": True}),
    ("text-stream", "completions", {**TEXT, **STREAM}),
    ("text-stream-usage", "completions", {**TEXT, **USAGE}),
    ("text-stream-echo", "completions", {**TEXT, **STREAM, "echo": True}),
    ("text-stream-echo-logprobs", "completions", {**TEXT, **STREAM, "echo": True, "logprobs": 1}),
    ("text-stream-echo-batch", "completions",
     {**TEXT, **STREAM, **SAMPLED, "echo": True, "n": 2, "prompt": TWO}),
    ("text-stream-logprobs", "completions", {**TEXT, **STREAM, "logprobs": 0}),
    ("chat", "chat", CHAT),
    ("chat-logprobs", "chat", {**CHAT, "logprobs": True, "top_logprobs": 2}),
    ("chat-top-logprobs-alone", "chat", {**CHAT, "top_logprobs": 2}),
    ("chat-n2", "chat", {**CHAT, **SAMPLED, "n": 2}),
    ("chat-stop", "chat", {**CHAT, "stop": ["Paris"], "max_tokens": 16}),
    ("chat-max-tokens", "chat", {**CHAT, "max_tokens": 2}),
    ("chat-token-ids", "chat", {**CHAT, "return_token_ids": True}),
    ("chat-prompt-logprobs", "chat", {**CHAT, "prompt_logprobs": 1}),
    ("chat-echo", "chat", {**CHAT, **CONTINUE}),
    ("chat-json", "chat", {**CHAT, "response_format": PERSON, "max_tokens": 24}),
    ("chat-json-object", "chat", {**CHAT, "response_format": {"type": "json_object"}}),
    ("chat-tool-forced", "chat", {**CHAT, **TOOL, "tool_choice": FORCED}),
    ("chat-tool-required", "chat", {**CHAT, **TOOL, "tool_choice": "required"}),
    ("chat-stream", "chat", {**CHAT, **STREAM}),
    ("chat-stream-usage", "chat", {**CHAT, **USAGE}),
    ("chat-stream-usage-every-chunk", "chat", {**CHAT, **EVERY}),
    ("chat-stream-continuous-alone", "chat", {**CHAT, **CONTINUOUS}),
    ("chat-stream-logprobs", "chat", {**CHAT, **STREAM, "logprobs": True, "top_logprobs": 1}),
    ("chat-stream-token-ids", "chat", {**CHAT, **STREAM, "return_token_ids": True}),
    ("chat-stream-n2", "chat", {**CHAT, **STREAM, **SAMPLED, "n": 2}),
    ("chat-stream-tool-forced", "chat", {**CHAT, **STREAM, **TOOL, "tool_choice": FORCED}),
    ("chat-stream-tool-auto", "chat", {**CHAT, **STREAM, **TOOL}),
]  # fmt: skip

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

# --- what a client sees ---------------------------------------------------------------------


def answer_of(base_url: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer, normalised for comparison: status and body (non-streamed) or the stream's
    summary; the documented differences removed."""
    url = base_url + PATHS[endpoint]
    if not body.get("stream"):
        r = httpx.post(url, json=body, timeout=120)
        return {"status": r.status_code, "body": _without_volatile(r.json())}
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": _without_volatile(orjson.loads(r.read()))}
        events = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    return {"status": 200, "stream": summarise(events)}


def _without_volatile(data: Any) -> Any:
    if isinstance(data, dict):
        data = {k: _without_volatile(v) for k, v in data.items() if k not in ("id", "created")}
        if data.get("type") == "function" and "function" in data:
            data.pop("id", None)  # a tool call's id
    elif isinstance(data, list):
        data = [_without_volatile(v) for v in data]
    return data


def _empty_summary() -> dict[str, Any]:
    return {"text": "", "tools": "", "fields": [], "logprobs": [], "finish": [], "ids": []}


def summarise(events: list[str]) -> dict[str, Any]:
    """What a stream says, independent of where vLLM cut it into chunks."""
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [orjson.loads(e) for e in events[:-1]]
    per_choice: dict[int, dict[str, Any]] = {}
    errors = [_without_volatile(c["error"]) for c in chunks if "error" in c]
    for chunk in chunks:
        for c in chunk.get("choices") or ():
            s = per_choice.setdefault(c["index"], _empty_summary())
            delta = c.get("delta") or {}
            s["text"] += c.get("text") or delta.get("content") or ""
            for tc in delta.get("tool_calls") or ():
                s["tools"] += orjson.dumps(_without_volatile(tc)).decode()
            fields = (*c, *(f"delta.{k}" for k in delta))
            if not s["fields"] or s["fields"][-1] != fields:
                s["fields"].append(fields)
            s["logprobs"].append(_without_volatile(c.get("logprobs")))
            s["ids"] += [c.get("prompt_token_ids"), c.get("token_ids")]
            s["finish"].append(c.get("finish_reason"))
    for s in per_choice.values():  # chunk boundaries removed from the per-token lists
        s["logprobs"] = [x for x in s["logprobs"] if x is not None]
        s["ids"] = [x for x in s["ids"] if x is not None]
        s["finish"] = [x for x in s["finish"] if x is not None]
    usage = [c["usage"] for c in chunks if c.get("choices") == [] and c.get("usage")]
    top = sorted({k for c in chunks for k in c} - {"system_fingerprint"})
    return {"choices": per_choice, "usage": usage, "top": top, "errors": errors}


# --- the rule --------------------------------------------------------------------------------


def check(gateway: Callable[[str, dict[str, Any]], dict[str, Any]], vllm_url: str,
          endpoint: str, body: dict[str, Any]) -> None:  # fmt: skip
    direct = answer_of(vllm_url, endpoint, {**copy.deepcopy(body), "model": FULL})
    through = gateway(endpoint, {**copy.deepcopy(body), "model": "full"})
    assert through == direct


@pytest.mark.parametrize(("endpoint", "body"), [pytest.param(e, b, id=i) for i, e, b in CASES])
def test_the_gateway_answers_as_vllm_does(real_stack, endpoint, body):
    check(lambda e, b: answer_of(real_stack.url, e, b), real_stack.full_url, endpoint, body)


def step_of(stack, r: httpx.Response) -> dict[str, Any]:
    step = httpx.get(f"{stack.url}/v1/steps/{r.headers['x-gearshift-step-id']}", timeout=30)
    assert step.status_code == 200, step.text
    return step.json()


def test_an_echo_records_the_completions_own_tokens(real_stack):
    """The echo the client sees has its prompt in front; the record holds the completion's
    ids and log-probabilities alone, aligned."""
    body = {**TEXT, "model": "full", "echo": True, "logprobs": 0}
    r = httpx.post(real_stack.url + "/v1/completions", json=body, timeout=120)
    assert r.json()["choices"][0]["text"].startswith(PROMPT)
    got = step_of(real_stack, r)
    direct = httpx.post(
        real_stack.full_url + "/v1/completions",
        json={**TEXT, "model": FULL, "return_token_ids": True, "logprobs": 0},
        timeout=120,
    ).json()["choices"][0]
    assert got["completion_token_ids"] == direct["token_ids"]
    assert got["logprobs"] == pytest.approx(direct["logprobs"]["token_logprobs"], abs=1e-5)


def test_a_stream_without_usage_keeps_its_system_fingerprint(real_stack):
    """The gateway asks the stream for its usage chunk, where vLLM then puts the
    fingerprint; the client, who did not ask, gets it on the finishing chunks as from vLLM."""

    def fingerprints(url: str, model: str) -> list[tuple[str | None, str]]:
        body = {**CHAT, **STREAM, "model": model}
        with httpx.stream("POST", url + PATHS["chat"], json=body, timeout=120) as r:
            chunks = [orjson.loads(x[5:]) for x in r.iter_lines() if x.startswith("data: {")]
        return [(c["choices"][0]["finish_reason"] if c["choices"] else None,
                 c["system_fingerprint"]) for c in chunks if "system_fingerprint" in c]  # fmt: skip

    direct = fingerprints(real_stack.full_url, FULL)
    assert direct and all(finish for finish, _ in direct)
    assert fingerprints(real_stack.url, "full") == direct


def test_a_completion_records_its_prompt_ids(real_stack):
    r = httpx.post(
        real_stack.url + PATHS["completions"], json={**TEXT, "model": "full"}, timeout=120
    )
    direct = httpx.post(
        real_stack.full_url + PATHS["completions"],
        json={**TEXT, "model": FULL, "return_token_ids": True},
        timeout=120,
    ).json()["choices"][0]
    assert step_of(real_stack, r)["prompt_token_ids"] == direct["prompt_token_ids"]
