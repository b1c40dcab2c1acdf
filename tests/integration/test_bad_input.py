"""Malformed and hostile input: always a 4xx in the OpenAI error shape, and the gateway keeps serving."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from gateway.auth import hash_key
from tests.support.fake_upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hi"}]


def assert_openai_error(
    r: httpx.Response, status: int, *, param: str | None = None, says: str = ""
) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert says.lower() in error["message"].lower()
    if param is not None:
        assert error["param"] == param
    assert r.headers["x-request-id"]


@pytest.fixture
def gateway(make_stack):
    upstream = FakeUpstream()
    stack = make_stack([upstream], limits={"max_body_bytes": 4096})
    yield stack, upstream
    # Whatever came before, the gateway still answers.
    r = httpx.post(stack.url + "/v1/chat/completions", json={"model": "full", "messages": MESSAGES})
    assert r.status_code == 200, r.text  # the error says which (e.g. a replica marked down)


def post(stack, content: bytes | str, path: str = "/v1/chat/completions", **kw) -> httpx.Response:
    return httpx.post(
        stack.url + path, content=content, headers={"content-type": "application/json"}, **kw
    )


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"", 400, None, "empty"),
        (b"[1, 2]", 400, None, "must be a JSON object"),
        (b'"text"', 400, None, "must be a JSON object"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "model", "Field required"),
        (b'{"model": "full"}', 400, "messages", "Field required"),
        (b'{"model": "full", "messages": []}', 400, "messages", "at least 1"),
        (b'{"model": "full", "messages": "hi"}', 400, "messages", "valid list"),
        (
            b'{"model": "full", "messages": [{"role": "wizard", "content": "x"}]}',
            400,
            "messages.0.role",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": 5}]}',
            400,
            "messages.0.content",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
            400,
            "max_tokens",
            "integer",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            400,
            "max_tokens",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            400,
            "stream",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "temperature": 9}',
            400,
            "temperature",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "n": -1}',
            400,
            "n",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
            400,
            "tools.0.function",
            "",
        ),
        (
            b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}',
            400,
            "tool_choice",
            "",
        ),
        (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', 400, "model", ""),
        (
            b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model",
            "does not exist",
        ),
    ],
)
def test_malformed_chat_requests(gateway, body, status, param, says):
    stack, upstream = gateway
    assert_openai_error(post(stack, body), status, param=param, says=says)
    assert not upstream.requests


def test_a_named_sessions_next_step_is_validated_too(gateway):
    """A session's repeated history is not validated again; its new messages are, and the
    error names them where the whole body has them."""
    stack, upstream = gateway
    history = [*MESSAGES, {"role": "assistant", "content": "hello"}]
    session = {"x-session-id": "s-1"}
    first = httpx.post(
        stack.url + "/v1/chat/completions", json={"model": "full", "messages": history},
        headers=session,
    )  # fmt: skip
    assert first.status_code == 200, first.text
    bad = {"model": "full", "messages": [*history, {"role": "user", "content": 5}]}
    r = httpx.post(stack.url + "/v1/chat/completions", json=bad, headers=session)
    assert_openai_error(r, 400, param="messages.2.content", says="valid string")
    assert len(upstream.requests) == 1


def test_bad_completions_prompt(gateway):
    stack, _ = gateway
    assert_openai_error(
        post(stack, b'{"model": "full", "prompt": {"a": 1}}', "/v1/completions"),
        400,
        param="prompt",
    )


def test_oversized_body_is_refused(gateway):
    stack, upstream = gateway
    big = b'{"model": "full", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
    assert_openai_error(post(stack, big), 413, says="exceeds the limit of 4096 bytes")
    assert not upstream.requests


def test_oversized_chunked_body_is_refused(gateway):
    stack, _ = gateway

    def body():
        yield b'{"model": "full", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    assert_openai_error(post(stack, body()), 413)


def test_unknown_route_and_wrong_method(gateway):
    stack, _ = gateway
    assert_openai_error(httpx.get(stack.url + "/v1/nothing"), 404, says="no route")
    assert_openai_error(httpx.get(stack.url + "/v1/chat/completions"), 405)


def test_deeply_nested_json_is_refused(gateway):
    stack, _ = gateway
    nested = (
        b'{"model": "full", "messages": [{"role": "user", "content": "x"}], "x": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}"
    )
    r = post(stack, nested)
    assert r.status_code in (400, 413)


def test_truncated_request_does_not_hang_a_worker(gateway):
    stack, _ = gateway
    port = int(stack.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"model"'
        )
    # The connection is gone with the body half sent; the next request is served normally.


def test_openai_client_maps_errors(gateway):
    stack, _ = gateway
    client = stack.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="full", messages=[])


def test_api_keys(make_stack):
    upstream = FakeUpstream()
    key = "gs-test-key"
    stack = make_stack(
        [upstream],
        auth={"mode": "keys", "keys": [{"name": "ci", "tenant": "acme", "sha256": hash_key(key)}]},
    )
    url = stack.url + "/v1/chat/completions"
    body = {"model": "full", "messages": MESSAGES}
    assert_openai_error(httpx.post(url, json=body), 401, says="missing API key")
    assert_openai_error(
        httpx.post(url, json=body, headers={"authorization": "Basic abc"}), 401, says="malformed"
    )
    assert_openai_error(
        httpx.post(url, json=body, headers={"authorization": "Bearer wrong"}), 401, says="invalid"
    )
    assert_openai_error(httpx.get(stack.url + "/v1/models"), 401)
    with pytest.raises(openai.AuthenticationError):
        stack.client(api_key="wrong").chat.completions.create(model="full", messages=MESSAGES)
    assert not upstream.requests
    answer = stack.client(api_key=key).chat.completions.create(model="full", messages=MESSAGES)
    assert answer.choices[0].message.content == "hello from fake"
    assert httpx.get(stack.url + "/health").status_code == 200  # probes need no key
