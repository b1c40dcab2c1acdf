"""The answer stage: what the client gets of a whole upstream answer, and what it tells."""

from __future__ import annotations

import orjson
import pytest

from gateway.pipeline.answer import answer, parsed_body, stream_capture
from gateway.recording.capture import Wants
from gateway.recording.records import RawJson
from gateway.upstream.dispatch import Completed


def completed(data: object, status: int = 200) -> Completed:
    body = data if isinstance(data, bytes) else orjson.dumps(data)
    return Completed(status, body, {"content-type": "application/json"})


def choice(index: int, content: str, finish: str, ids: list[int], logprob: float) -> dict:
    return {
        "index": index,
        "message": {"role": "assistant", "content": content},
        "finish_reason": finish,
        "token_ids": ids,
        "logprobs": {"content": [{"token": content[0], "logprob": logprob}]},
    }


def chat_answer(**extra: object) -> dict:
    return {
        "id": "c-1",
        "model": "model-fast",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            choice(0, "one", "stop", [10, 11], -0.5),
            choice(1, "two", "length", [12], -1.0),
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        **extra,
    }


def test_a_200_tells_usage_finish_reasons_and_model_and_passes_the_body_through():
    result = completed(chat_answer())
    reply = answer(result, "chat", None, False, "r-1")
    assert reply.status == 200 and reply.body is result.body
    assert (reply.prompt_tokens, reply.completion_tokens) == (3, 3)
    assert reply.finish_reasons == ("stop", "length") and reply.model == "model-fast"
    assert reply.captured is None and reply.answers is None and reply.error is None


def test_a_captured_answer_keeps_token_ids_and_logprobs_and_strips_them_for_the_client():
    reply = answer(completed(chat_answer()), "chat", Wants(False, False), False, "r-1")
    assert reply.captured is not None
    ids = reply.captured.prompt_token_ids
    assert isinstance(ids, RawJson) and ids.parsed() == [1, 2, 3]  # never parsed on the way
    assert reply.captured.model == "model-fast"
    assert [c.token_ids for c in reply.captured.choices] == [[10, 11], [12]]
    assert [c.logprobs for c in reply.captured.choices] == [[-0.5], [-1.0]]
    assert [c.finish_reason for c in reply.captured.choices] == ["stop", "length"]
    sent = orjson.loads(reply.body)
    # what the client's own request would have got: no value (absent or null, as vLLM writes)
    assert sent.get("prompt_token_ids") is None
    assert all(c.get("token_ids") is None and c.get("logprobs") is None for c in sent["choices"])
    assert [c["message"]["content"] for c in sent["choices"]] == ["one", "two"]


def test_a_client_that_asked_for_everything_gets_the_body_as_it_came():
    result = completed(chat_answer())
    reply = answer(result, "chat", Wants(True, True), False, "r-1")
    assert reply.body is result.body and reply.captured is not None


def test_a_client_that_asked_for_logprobs_only_keeps_them():
    reply = answer(completed(chat_answer()), "chat", Wants(True, False), False, "r-1")
    sent = orjson.loads(reply.body)
    assert sent.get("prompt_token_ids") is None
    assert sent["choices"][0]["logprobs"] == {"content": [{"token": "o", "logprob": -0.5}]}
    assert sent["choices"][0].get("token_ids") is None


def test_a_client_that_asked_for_token_ids_only_gets_them_as_the_engine_wrote_them():
    body = orjson.dumps(chat_answer()).replace(b"[1,2,3]", b"[1, 2,  3]")
    reply = answer(completed(body), "chat", Wants(False, True), False, "r-1")
    assert b'"prompt_token_ids":[1, 2,  3]' in reply.body  # the engine's bytes, unparsed
    sent = orjson.loads(reply.body)
    assert sent["prompt_token_ids"] == [1, 2, 3] and sent["choices"][0]["token_ids"] == [10, 11]
    assert sent["choices"][0].get("logprobs") is None


def test_completions_are_captured_as_text():
    data = {
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "abc",
                "token_ids": [5],
                "logprobs": {"token_logprobs": [-0.25]},
                "finish_reason": "stop",
            }
        ],
    }
    reply = answer(completed(data), "completions", Wants(True, True), False, "r-1")
    (choice,) = reply.captured.choices
    assert choice.message == {"text": "abc"} and choice.logprobs == [-0.25]


def test_an_unnamed_sessions_answers_are_kept_for_its_chain():
    reply = answer(completed(chat_answer()), "chat", None, True, "r-1")
    assert reply.answers == (
        {"role": "assistant", "content": "one"},
        {"role": "assistant", "content": "two"},
    )


def test_an_openai_error_passes_through_with_its_status():
    body = {
        "error": {
            "message": "max_tokens is too large",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
    result = completed(body, status=400)
    reply = answer(result, "chat", Wants(False, False), True, "r-1")
    assert reply.status == 400 and reply.body is result.body
    assert reply.error == "max_tokens is too large"
    assert reply.captured is None and reply.answers is None and reply.prompt_tokens is None


@pytest.mark.parametrize("raw", [b"Not Found", b'{"detail": "Not Found"}', b'{"error": "flat"}'])
def test_an_error_in_another_shape_is_wrapped_into_the_openai_shape(raw):
    reply = answer(completed(raw, status=404), "chat", None, False, "r-1")
    assert reply.status == 404
    assert orjson.loads(reply.body) == {
        "error": {
            "message": "upstream: " + raw.decode(),
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert reply.error == raw.decode()


def test_a_200_body_that_is_not_json_is_passed_through(caplog):
    result = completed(b"<html>ok</html>")
    reply = answer(result, "chat", Wants(False, False), True, "r-1")
    assert reply.status == 200 and reply.body == b"<html>ok</html>"
    assert reply.prompt_tokens is None and reply.captured is None and reply.answers is None
    assert "request r-1" in caplog.text and "not a JSON object" in caplog.text


def test_a_200_json_that_is_not_an_object_is_passed_through():
    reply = answer(completed([1, 2]), "chat", None, False, "r-1")
    assert reply.status == 200 and reply.body == b"[1,2]" and reply.finish_reasons == ()


def test_odd_fields_in_a_200_are_ignored_not_trusted():
    data = {
        "model": 5,
        "usage": {"prompt_tokens": True, "completion_tokens": "4"},
        "choices": ["junk", {"message": {"content": "x"}, "finish_reason": None}],
    }
    reply = answer(completed(data), "chat", None, False, "r-1")
    assert reply.model is None and (reply.prompt_tokens, reply.completion_tokens) == (None, None)
    assert reply.finish_reasons == ("",)


def test_a_200_whose_choices_is_not_a_list_is_passed_through():
    result = completed({"model": "m", "choices": 3})
    reply = answer(result, "chat", None, False, "r-1")
    assert reply.status == 200 and reply.finish_reasons == ()


def test_parsed_body_parses_once():
    result = completed(chat_answer())
    first = parsed_body(result, "chat")
    assert first is not None and parsed_body(result, "chat") is first and result.data is first
    assert parsed_body(completed(b"nope"), "chat") is None


def test_stream_capture_is_recording_or_a_chain_assembler_or_nothing():
    assert stream_capture("chat", None, False) is None
    chain = stream_capture("chat", None, True)
    ev = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"token_ids":[1]}]}\n\n'
    assert chain is not None and chain.on_event(ev) == ev  # leaves events as they are
    assert chain.choices()[0].message == {"role": "assistant", "content": "x"}
    recording = stream_capture("chat", Wants(False, False), False)
    assert recording is not None
    shown = orjson.loads(recording.on_event(ev)[6:])
    assert shown["choices"][0]["delta"] == {"content": "x"}
    assert shown["choices"][0].get("token_ids") is None
