"""The upstream body: the client's parameters as sent, what capture and usage add, the
tier's model; the client's own body never changes."""

from __future__ import annotations

import copy

import orjson
import pytest

from gateway.pipeline.upstream_body import build_upstream_request
from gateway.recording.capture import Wants
from tests.gateway.pipeline.conftest import MESSAGES, parsed


def test_a_plain_request_reaches_the_tier_as_sent_but_for_the_model():
    body = {"model": "auto", "messages": MESSAGES, "temperature": 0.2, "brand_new_param": [1]}
    up = build_upstream_request(parsed(body), capture=False)
    assert up.path == "/v1/chat/completions" and up.stream is False
    assert up.wants is None and up.strip_usage is False
    assert orjson.loads(up.payload("model-full")) == {**body, "model": "model-full"}


def test_completions_go_to_their_own_path():
    up = build_upstream_request(
        parsed({"model": "auto", "prompt": "x"}, endpoint="completions"), capture=False
    )
    assert up.path == "/v1/completions"


def test_a_stream_asks_for_usage_and_strips_it_again():
    body = {"model": "auto", "messages": MESSAGES, "stream": True}
    up = build_upstream_request(parsed(body), capture=False)
    assert up.stream and up.strip_usage
    assert orjson.loads(up.payload("m"))["stream_options"] == {"include_usage": True}


def test_stream_options_of_the_client_are_kept_beside_include_usage():
    body = {"model": "auto", "messages": MESSAGES, "stream": True,
            "stream_options": {"include_obfuscation": False}}  # fmt: skip
    up = build_upstream_request(parsed(body), capture=False)
    assert up.strip_usage
    assert orjson.loads(up.payload("m"))["stream_options"] == {
        "include_obfuscation": False,
        "include_usage": True,
    }


def test_continuous_usage_without_include_usage_asks_only_for_the_final_usage():
    # vLLM sends continuous usage only with include_usage: the client that sent it alone
    # gets no usage, so the gateway's own usage chunk must stay the only one (and is dropped)
    body = {"model": "auto", "messages": MESSAGES, "stream": True,
            "stream_options": {"continuous_usage_stats": True}}  # fmt: skip
    up = build_upstream_request(parsed(body), capture=False)
    assert up.strip_usage
    assert orjson.loads(up.payload("m"))["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }


def test_usage_the_client_asked_for_is_its_own():
    body = {
        "model": "auto",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    up = build_upstream_request(parsed(body), capture=False)
    assert not up.strip_usage
    assert orjson.loads(up.payload("m"))["stream_options"] == {"include_usage": True}


def test_a_non_streamed_request_gets_no_stream_options():
    up = build_upstream_request(parsed(), capture=False)
    assert "stream_options" not in orjson.loads(up.payload("m"))


@pytest.mark.parametrize(
    ("extra", "wants", "logprobs"),
    [
        ({}, Wants(logprobs=False, token_ids=False), True),
        ({"logprobs": True}, Wants(logprobs=True, token_ids=False), True),
        ({"return_token_ids": True}, Wants(logprobs=False, token_ids=True), True),
    ],
)
def test_capture_on_a_chat_asks_for_token_ids_and_logprobs(extra, wants, logprobs):
    up = build_upstream_request(
        parsed({"model": "auto", "messages": MESSAGES, **extra}), capture=True
    )
    sent = orjson.loads(up.payload("m"))
    assert (up.wants.logprobs, up.wants.token_ids) == (wants.logprobs, wants.token_ids)
    assert sent["return_token_ids"] is True and sent["logprobs"] is logprobs


@pytest.mark.parametrize(
    ("asked", "sent", "wanted"), [(None, 0, False), (0, 0, True), (3, 3, True)]
)
def test_capture_on_completions_asks_for_the_sampled_logprob(asked, sent, wanted):
    body = {"model": "auto", "prompt": "x"}
    if asked is not None:
        body["logprobs"] = asked
    up = build_upstream_request(parsed(body, endpoint="completions"), capture=True)
    assert orjson.loads(up.payload("m"))["logprobs"] == sent
    assert (up.wants.logprobs, up.wants.token_ids) == (wanted, False)


def test_the_clients_body_is_never_changed():
    body = {
        "model": "auto",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
        "logprobs": False,
    }
    before = copy.deepcopy(body)
    request = parsed(body)
    up = build_upstream_request(request, capture=True)
    up.payload("model-full")
    up.payload("model-fast")
    assert request.body == before and body == before
    assert request.body is not up.body


def test_the_payload_is_serialised_once_per_model():
    up = build_upstream_request(parsed(), capture=False)
    full = up.payload("model-full")
    assert up.payload("model-full") is full  # a retry on the same tier reuses the bytes
    fast = up.payload("model-fast")
    assert (
        orjson.loads(fast)["model"] == "model-fast" and orjson.loads(full)["model"] == "model-full"
    )
    assert "model" in up.body and up.body["model"] == "auto"  # the shared body keeps the client's


def test_fields_already_written_are_embedded_as_the_same_bytes():
    from dataclasses import replace

    body = {"messages": MESSAGES, "model": "auto", "tools": [{"type": "function"}], "n": 1}
    encoded = {"messages": orjson.dumps(MESSAGES), "tools": orjson.dumps(body["tools"])}
    for capture in (False, True):
        for stream in (False, True):
            sent = {**body, "stream": stream}
            plain = build_upstream_request(parsed(sent), capture=capture)
            shared = build_upstream_request(replace(parsed(sent), encoded=encoded), capture=capture)
            assert set(shared.written) == {"messages", "tools"}
            for model in ("model-full", "model-fast"):
                expected = orjson.dumps({**plain.body, "model": model})
                assert shared.payload(model) == expected  # key order too: messages first


def test_condensed_messages_are_written_anew():
    from dataclasses import replace

    encoded = {"messages": orjson.dumps(MESSAGES)}
    condensed = [{"role": "user", "content": "short"}]
    up = build_upstream_request(
        replace(parsed(), encoded=encoded), capture=False, messages=condensed
    )
    assert up.written == {}
    assert orjson.loads(up.payload("m"))["messages"] == condensed
