"""Capture: what recording adds to the upstream body, how the answer to that body is turned
back into vLLM's answer to the client's own body, and what is recorded.

The payloads are vLLM 0.32's (SmolLM2-135M, "The capital of France is", greedy), trimmed;
each pair is the answer to the client's body and to the body ``prepare`` made of it.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from gateway.recording.capture import StreamCapture, Wants, choices_of, prepare, strip
from gateway.recording.records import RawJson

PROMPT = "The capital of France is"
PROMPT_IDS = [504, 3575, 282, 4649, 314]
# logprobs of an echo with logprobs 0: the prompt's tokens (the first has none), then " Paris", "."
ECHO_LOGPROBS = {
    "text_offset": [0, 3, 11, 14, 21, 24, 30],
    "token_logprobs": [None, -11.77, -0.30, -2.46, -0.51, -0.24, -0.39],
    "tokens": ["The", " capital", " of", " France", " is", " Paris", "."],
    "top_logprobs": [None, {" capital": -11.77}, {" of": -0.30}, {" France": -2.46},
                     {" is": -0.51}, {" Paris": -0.24}, {".": -0.39}],
}  # fmt: skip
PROMPT_LOGPROBS = [
    None,
    {"3575": {"logprob": -11.77, "rank": 3109, "decoded_token": " capital"}},
    {"282": {"logprob": -0.30, "rank": 1, "decoded_token": " of"}},
    {"4649": {"logprob": -2.46, "rank": 2, "decoded_token": " France"}},
    {"314": {"logprob": -0.51, "rank": 1, "decoded_token": " is"}},
]


def completion(**choice: Any) -> dict[str, Any]:
    base = {"index": 0, "text": " Paris.", "logprobs": None, "finish_reason": "length",
            "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
            "prompt_token_ids": None, "routed_experts": None}  # fmt: skip
    return {
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "smol",
        "choices": [{**base, **choice}], "system_fingerprint": "vllm-0.32.0",
        "usage": {"prompt_tokens": 5, "total_tokens": 7, "completion_tokens": 2},
    }  # fmt: skip


def captured_echo(**choice: Any) -> dict[str, Any]:
    """vLLM's answer to an echo with ``return_token_ids`` and ``logprobs: 0`` added: the
    prompt's text is gone from ``text`` and its tokens lead ``logprobs``."""
    return completion(
        text=" Paris.",
        logprobs=ECHO_LOGPROBS,
        token_ids=[7042, 30],
        prompt_logprobs=PROMPT_LOGPROBS,
        prompt_token_ids=PROMPT_IDS,
        **choice,
    )


def prepared(endpoint: str, body: dict[str, Any]) -> tuple[dict[str, Any], Wants]:
    sent = copy.deepcopy(body)
    return sent, prepare(endpoint, sent)


# --- prepare -------------------------------------------------------------------------------


def test_a_chat_asks_for_ids_and_logprobs():
    sent, wants = prepared("chat", {"messages": [], "logprobs": False})
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert wants == Wants(logprobs=False, token_ids=False)


@pytest.mark.parametrize("extra", [{"top_logprobs": 2}, {"top_logprobs": -1},
                                   {"logprob_token_ids": [5]}])  # fmt: skip
def test_a_chat_vllm_refuses_without_logprobs_goes_without_them(extra):
    sent, _ = prepared("chat", {"messages": [], **extra})
    assert "logprobs" not in sent  # vLLM answers 400, as it would to the client
    assert sent["return_token_ids"] is True


def test_completions_ask_for_the_sampled_logprob_alone():
    sent, wants = prepared("completions", {"prompt": PROMPT})
    assert sent["logprobs"] == 0 and sent["return_token_ids"] is True
    assert wants == Wants(logprobs=False, token_ids=False, prompt_logprobs=False)


@pytest.mark.parametrize(
    ("extra", "prompt_logprobs"),
    [({}, False), ({"logprobs": 0}, True), ({"prompt_logprobs": 1}, True)],
)
def test_an_echo_shows_prompt_logprobs_only_when_vllm_would(extra, prompt_logprobs):
    _, wants = prepared("completions", {"prompt": PROMPT, "echo": True, **extra})
    assert wants.prompt_logprobs is prompt_logprobs


def test_an_echo_remembers_the_prompts_the_token_ids_take_out():
    _, wants = prepared("completions", {"prompt": [PROMPT, "Two"], "echo": True, "n": 2})
    assert wants.echo and wants.echo_prompts == (PROMPT, "Two") and wants.n == 2


def test_an_echo_with_token_ids_asked_has_nothing_to_put_back():
    _, wants = prepared("completions", {"prompt": PROMPT, "echo": True, "return_token_ids": True})
    assert wants.echo and wants.echo_prompts == ()


@pytest.mark.parametrize("prompt", [[504, 3575], [[504], [3575]]])
def test_an_echo_of_token_ids_goes_as_sent(prompt):
    body = {"prompt": prompt, "echo": True}
    sent, wants = prepared("completions", body)
    assert sent == body  # vLLM's echo is its decoding of the ids: not the gateway's to redo
    assert wants.echo and not wants.token_ids


@pytest.mark.parametrize(
    "extra",
    [
        {"logprob_token_ids": [7042]},  # vLLM: "`logprobs` must be set"
        {"echo": True, "use_beam_search": True, "n": 2},  # vLLM refuses echo + logprobs
        {"echo": True, "stream": True, "n": 2, "seed": 1},  # vLLM fails mid-stream
    ],
)
def test_completions_vllm_answers_otherwise_with_logprobs_go_without_them(extra):
    sent, _ = prepared("completions", {"prompt": PROMPT, **extra})
    assert "logprobs" not in sent and sent["return_token_ids"] is True


# --- strip: whole answers --------------------------------------------------------------------


def test_an_echo_gets_its_prompt_back_and_nothing_it_did_not_ask_for():
    _, wants = prepared("completions", {"prompt": PROMPT, "echo": True})
    data = captured_echo()
    strip(data, wants)
    assert data == completion(text=PROMPT + " Paris.")  # vLLM's answer to the client's body


def test_an_echo_with_logprobs_keeps_them_and_its_prompt_logprobs():
    _, wants = prepared("completions", {"prompt": PROMPT, "echo": True, "logprobs": 0})
    data = captured_echo()
    strip(data, wants)
    assert data == completion(
        text=PROMPT + " Paris.", logprobs=ECHO_LOGPROBS, prompt_logprobs=PROMPT_LOGPROBS
    )


def test_an_echo_of_a_batch_puts_each_prompt_before_its_samples():
    _, wants = prepared("completions", {"prompt": ["A", "B"], "echo": True, "n": 2})
    data = {"choices": [{"index": i, "text": f" {i}"} for i in range(4)]}
    strip(data, wants)
    assert [c["text"] for c in data["choices"]] == ["A 0", "A 1", "B 2", "B 3"]


def test_an_echo_that_asked_for_token_ids_is_vllms_as_is():
    _, wants = prepared("completions", {"prompt": PROMPT, "echo": True, "return_token_ids": True})
    data = captured_echo()
    strip(data, wants)
    assert data == completion(text=" Paris.", token_ids=[7042, 30], prompt_token_ids=PROMPT_IDS)


def test_a_chat_answer_keeps_the_keys_vllm_writes_as_null():
    captured = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                     "logprobs": {"content": [{"token": "Hello", "logprob": -0.58}]},
                     "finish_reason": "length", "token_ids": [19556, 17]}],
        "prompt_logprobs": None, "prompt_token_ids": [1, 9690], "prompt_text": None,
    }  # fmt: skip
    _, wants = prepared("chat", {"messages": []})
    strip(captured, wants)
    assert captured["prompt_token_ids"] is None and captured["prompt_logprobs"] is None
    choice = captured["choices"][0]
    assert choice["token_ids"] is None and choice["logprobs"] is None
    assert choice["message"]["content"] == "Hello!"


# --- what is recorded ----------------------------------------------------------------------


def test_an_echo_records_the_completions_tokens_alone():
    (got,) = choices_of(captured_echo(), "completions")
    assert got.token_ids == [7042, 30]
    assert got.logprobs == [-0.24, -0.39]
    assert got.message == {"text": " Paris."}


def test_an_echo_of_max_tokens_0_records_no_tokens():
    """vLLM generates one token for it and reports its id, but shows only the prompt."""
    lp = {k: v[:5] for k, v in ECHO_LOGPROBS.items()}
    data = completion(text="", logprobs=lp, token_ids=[198], prompt_logprobs=PROMPT_LOGPROBS,
                      prompt_token_ids=PROMPT_IDS)  # fmt: skip
    (got,) = choices_of(data, "completions")
    assert got.token_ids == [] and got.logprobs == []


def test_an_echo_sent_as_is_records_its_logprobs_without_the_prompts():
    data = completion(text=PROMPT + " Paris.", logprobs=ECHO_LOGPROBS,
                      prompt_logprobs=PROMPT_LOGPROBS)  # fmt: skip
    (got,) = choices_of(data, "completions")
    assert got.token_ids is None and got.logprobs == [-0.24, -0.39]


def test_a_plain_completion_records_all_its_logprobs():
    lp = {"token_logprobs": [-0.24, -0.39], "tokens": [" Paris", "."]}
    (got,) = choices_of(completion(logprobs=lp, token_ids=[7042, 30]), "completions")
    assert got.token_ids == [7042, 30] and got.logprobs == [-0.24, -0.39]


# --- streams ---------------------------------------------------------------------------------


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def text_chunk(**choice: Any) -> dict[str, Any]:
    base = {"index": 0, "text": "", "logprobs": None, "finish_reason": None,
            "stop_reason": None, "prompt_token_ids": None, "token_ids": None}  # fmt: skip
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "smol",
            "choices": [{**base, **choice}]}  # fmt: skip


def run(capture: StreamCapture, chunks: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    out = [capture.on_event(event(c)) for c in chunks]
    return [orjson.loads(e[5:]) if e else None for e in out]


def test_a_streamed_echo_is_vllms_and_records_the_completion():
    """vLLM puts the prompt's ids in an echo's first chunk whether asked or not."""
    _, wants = prepared("completions", {"prompt": PROMPT, "echo": True, "stream": True})
    lp_first = {k: v[:6] for k, v in ECHO_LOGPROBS.items()}
    lp_second = {"text_offset": [30], "token_logprobs": [-0.39], "tokens": ["."],
                 "top_logprobs": [{".": -0.39}]}  # fmt: skip
    upstream = [
        text_chunk(text=" Paris", logprobs=lp_first, prompt_token_ids=PROMPT_IDS, token_ids=[7042]),
        text_chunk(text=".", logprobs=lp_second, finish_reason="length", token_ids=[30]),
    ]
    capture = StreamCapture("completions", wants)
    assert run(capture, upstream) == [
        text_chunk(text=PROMPT + " Paris", prompt_token_ids=PROMPT_IDS),
        text_chunk(text=".", finish_reason="length"),
    ]
    (got,) = capture.choices()
    assert got.token_ids == [7042, 30] and got.logprobs == [-0.24, -0.39]
    assert got.message == {"text": " Paris."}
    assert capture.prompt_token_ids == PROMPT_IDS  # completions: per choice


def test_a_streamed_batch_echoes_each_choice_once():
    _, wants = prepared("completions", {"prompt": ["A", "B"], "echo": True, "stream": True})
    upstream = [text_chunk(index=0, text=" a", prompt_token_ids=[1]),
                text_chunk(index=1, text=" b", prompt_token_ids=[2]),
                text_chunk(index=0, text=" c")]  # fmt: skip
    shown = run(StreamCapture("completions", wants), upstream)
    assert [c["choices"][0]["text"] for c in shown] == ["A a", "B b", " c"]


def test_a_streamed_completion_hides_the_prompt_ids_it_did_not_ask_for():
    _, wants = prepared("completions", {"prompt": PROMPT, "stream": True})
    first = text_chunk(text=" Paris", prompt_token_ids=PROMPT_IDS, token_ids=[7042],
                       logprobs={"token_logprobs": [-0.24], "tokens": [" Paris"]})  # fmt: skip
    capture = StreamCapture("completions", wants)
    assert run(capture, [first]) == [text_chunk(text=" Paris")]
    assert capture.prompt_token_ids == PROMPT_IDS


def chat_chunk(delta: dict[str, Any], token: int, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": None, "token_ids": [token],
              "logprobs": {"content": [{"token": "t", "logprob": -0.5, "bytes": [116],
                                        "top_logprobs": []}]}}  # fmt: skip
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "smol",
            "choices": [{**choice, **extra}]}  # fmt: skip


# A forced tool call's first tokens ("<", "tool", "_") yield no delta: vLLM sends them in
# chunks of their own only for their ids and logprobs.
TOOL_TAG = [chat_chunk({}, 44), chat_chunk({}, 19324),
            chat_chunk({}, 79, finish_reason="length", stop_reason=None)]  # fmt: skip


def test_a_chat_stream_drops_the_chunks_only_capture_asked_for():
    _, wants = prepared("chat", {"messages": [], "stream": True})
    capture = StreamCapture("chat", wants)
    shown = run(capture, TOOL_TAG)
    assert shown[:2] == [None, None]
    last = {"index": 0, "delta": {}, "finish_reason": "length", "token_ids": None,
            "logprobs": None, "stop_reason": None}  # fmt: skip
    assert shown[2]["choices"][0] == last
    (got,) = capture.choices()
    assert got.token_ids == [44, 19324, 79] and len(got.logprobs) == 3


@pytest.mark.parametrize("asked", [{"logprobs": True}, {"return_token_ids": True}])
def test_a_chat_stream_keeps_them_when_the_client_asked_for_either(asked):
    _, wants = prepared("chat", {"messages": [], "stream": True, **asked})
    assert all(run(StreamCapture("chat", wants), TOOL_TAG))


def test_a_chat_stream_that_asked_for_both_passes_as_it_came():
    _, wants = prepared("chat", {"messages": [], "logprobs": True, "return_token_ids": True})
    raw = event(TOOL_TAG[0])
    assert StreamCapture("chat", wants).on_event(raw) is raw


def test_the_first_chat_chunk_keeps_its_null_prompt_ids():
    first = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "smol",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}],
             "prompt_token_ids": [1, 9690], "prompt_text": None}  # fmt: skip
    _, wants = prepared("chat", {"messages": [], "stream": True})
    capture = StreamCapture("chat", wants)
    (shown,) = run(capture, [first])
    assert shown == {**first, "prompt_token_ids": None}
    ids = capture.prompt_token_ids  # kept unparsed for the recorder
    assert isinstance(ids, RawJson) and ids.parsed() == [1, 9690]


def test_a_chat_stream_that_asked_for_the_ids_gets_them_as_the_engine_wrote_them():
    _, wants = prepared("chat", {"messages": [], "stream": True, "return_token_ids": True})
    raw = b'data: {"id":"c","choices":[],"prompt_token_ids":[1, 9690]}\n\n'
    shown = StreamCapture("chat", wants).on_event(raw)
    assert b'"prompt_token_ids":[1, 9690]' in shown
