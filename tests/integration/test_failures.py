"""Replica failures before and after the first byte, and clients that go away."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest

from tests.integration.conftest import FULL_MODEL, dead_url
from tests.support.fake_upstream import Behaviour, FakeUpstream, status

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(stack, **kw):
    body = {"model": "full", "messages": MESSAGES, **kw}
    return httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=30)


def test_5xx_is_retried_before_the_first_byte(make_stack):
    full = FakeUpstream().then(status(500), status(503))
    stack = make_stack([full])
    r = chat(stack)
    assert r.status_code == 200
    assert len(full.requests) == 3
    assert stack.metric("gearshift_retries_total", {"tier": "full", "cause": "5xx"}) == 2


def test_5xx_on_every_attempt_gives_502_in_openai_shape(make_stack):
    full = FakeUpstream().then(status(500), status(500), status(500))
    stack = make_stack([full])
    with pytest.raises(openai.InternalServerError) as err:
        stack.client().chat.completions.create(model="full", messages=MESSAGES)
    assert err.value.status_code == 502
    assert err.value.body["code"] == "bad_gateway"
    assert "returned 500: boom" in err.value.body["message"]


def test_429_honours_retry_after(make_stack):
    full = FakeUpstream().then(status(429, {"retry-after": "0.3"}))
    stack = make_stack([full])
    started = time.monotonic()
    assert chat(stack).status_code == 200
    assert time.monotonic() - started >= 0.3
    assert len(full.requests) == 2


def test_429_with_long_retry_after_goes_to_the_client(make_stack):
    full = FakeUpstream().then(status(429, {"retry-after": "120"}))
    stack = make_stack([full])
    r = chat(stack)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "120"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert len(full.requests) == 1


def test_dead_replica_is_skipped_and_ejected(make_stack):
    live = FakeUpstream()
    dead = dead_url()
    stack = make_stack([dead, live])
    for _ in range(4):
        assert chat(stack).status_code == 200
    assert len(live.requests) == 4
    deadline = time.monotonic() + 5
    while True:
        replicas = httpx.get(stack.url + "/ready").json()["tiers"]["full"]["replicas"]
        state = {r["url"]: r["healthy"] for r in replicas}
        if state[dead] is False:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert state[dead] is False and any(state.values())


def test_replica_is_readmitted_when_its_health_returns(make_stack):
    flaky, steady = FakeUpstream("flaky"), FakeUpstream("steady")
    flaky.healthy = False
    stack = make_stack([flaky, steady])

    def flaky_state() -> bool:
        replicas = httpx.get(stack.url + "/ready").json()["tiers"]["full"]["replicas"]
        return next(r["healthy"] for r in replicas if r["url"] != replicas[1]["url"])

    deadline = time.monotonic() + 5
    while flaky_state():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for _ in range(3):
        chat(stack)
    assert not flaky.requests  # ejected replicas get no traffic
    flaky.healthy = True
    while not flaky_state():
        assert time.monotonic() < deadline + 5
        time.sleep(0.05)
    for _ in range(4):
        chat(stack)
    assert flaky.requests


def test_circuit_opens_after_consecutive_failures(make_stack):
    bad = FakeUpstream("bad").then(*[status(500)] * 50)
    good = FakeUpstream("good")
    stack = make_stack([bad, good], breaker={"failure_threshold": 2, "reset_after_s": 60})
    for _ in range(10):
        assert chat(stack).status_code == 200
    assert len(bad.requests) == 2  # opened after two, then skipped
    assert len(good.requests) == 10


def test_routed_request_falls_back_when_its_tier_is_down(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], [dead_url()])
    raw = stack.client().chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    assert raw.headers["x-gearshift-tier"] == "full"
    assert raw.headers["x-gearshift-route-reason"].endswith("; fallback to full")
    assert full.requests[0]["model"] == FULL_MODEL
    assert stack.metric("gearshift_fallbacks_total", {"from_tier": "fast", "to_tier": "full"}) == 1


def test_pinned_request_never_falls_back(make_stack):
    full = FakeUpstream("full")
    stack = make_stack([full], [dead_url()])
    r = httpx.post(stack.url + "/v1/chat/completions", json={"model": "fast", "messages": MESSAGES})
    # 502 if the dead replica was tried, 503 once health checks ejected it.
    assert (r.status_code, r.json()["error"]["code"]) in {
        (502, "upstream_unreachable"),
        (503, "no_healthy_replica"),
    }
    assert not full.requests


def test_first_byte_timeout_gives_504_and_cancels_upstream(make_stack):
    full = FakeUpstream().then(Behaviour("stall"))
    stack = make_stack([full], timeouts={"first_byte_s": 0.5})
    started = time.monotonic()
    r = chat(stack)
    assert r.status_code == 504
    assert r.json()["error"]["type"] == "timeout"
    assert time.monotonic() - started < 3
    _wait_for(lambda: full.disconnects == 1)


def test_stream_cut_after_first_byte_ends_with_error_event(make_stack):
    full = FakeUpstream().then(Behaviour("cut", after=2))
    stack = make_stack([full])
    stream = stack.client().chat.completions.create(model="full", messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            received.append(chunk)
    assert "the stream before [DONE]" in err.value.message
    # The role chunk always made it through; of the two tokens sent just before the cut,
    # aiohttp drops any still buffered when the connection error lands.
    assert 1 <= len(received) <= 3
    assert [c.choices[0].delta.content for c in received[1:]] == ["tok0 ", "tok1 "][
        : len(received) - 1
    ]
    stack.wait_metric(
        "gearshift_stream_errors_total", {"tier": "full", "kind": "upstream_unreachable"}, 1
    )


def test_stream_error_event_is_followed_by_done(make_stack):
    full = FakeUpstream().then(Behaviour("stall_mid", after=1))
    stack = make_stack([full], timeouts={"between_chunks_s": 0.3})
    with httpx.stream(
        "POST",
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES, "stream": True},
    ) as r:
        text = r.read().decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert '"type":"timeout"' in events[-2] and "mid-stream" in events[-2]


def test_failure_before_first_event_of_a_stream_is_retried(make_stack):
    full = FakeUpstream().then(Behaviour("cut", after=-1), status(500))
    stack = make_stack([full])
    chunks = list(
        stack.client().chat.completions.create(model="full", messages=MESSAGES, stream=True)
    )
    assert len(chunks) == 6
    assert len(full.requests) == 3


def test_client_disconnect_mid_stream_cancels_upstream(make_stack):
    full = FakeUpstream().then(Behaviour("stall_mid", after=1))
    stack = make_stack([full])
    with httpx.stream(
        "POST",
        stack.url + "/v1/chat/completions",
        json={"model": "full", "messages": MESSAGES, "stream": True},
    ) as r:
        chunks = r.iter_bytes()
        next(chunks)  # the first byte arrived
        assert full.disconnects == 0
    # Leaving the block hangs up mid-stream.
    _wait_for(lambda: full.disconnects == 1)
    _wait_for(lambda: stack.metric("gearshift_client_disconnects_total", {"tier": "full"}) == 1)


def test_client_disconnect_while_waiting_cancels_upstream(make_stack):
    full = FakeUpstream().then(Behaviour("stall"))
    stack = make_stack([full])
    port = int(stack.url.rsplit(":", 1)[1])
    body = b'{"model":"full","messages":[{"role":"user","content":"hi"}]}'
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        _wait_for(lambda: len(full.requests) == 1)
    _wait_for(lambda: full.disconnects == 1)


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_request_still_running_when_shutdown_drain_ends_gets_503_in_openai_shape(tmp_path):
    """uvicorn cancels what still runs when its graceful shutdown times out; the client gets
    a 503 it can act on (not uvicorn's bare 500) and the upstream request is abandoned."""
    import threading

    import httpx
    import uvicorn

    from gateway.config import Settings
    from gateway.http.app import create_app
    from tests.support.servers import free_port, serve_in_thread

    full = FakeUpstream().then(Behaviour("stall"))
    with serve_in_thread(full.app) as upstream:
        settings = Settings(
            tiers={"full": {"model": "m", "replicas": [upstream]}},
            router={"calibrate_tokens": False},
            store={"url": f"sqlite:///{tmp_path}/t.db"},
        )
        port = free_port()
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=port, log_level="critical",
            lifespan="on", timeout_graceful_shutdown=0.5,
        )  # fmt: skip
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        _wait_for(lambda: server.started)
        answer: list[httpx.Response] = []
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        asking = threading.Thread(
            target=lambda: answer.append(
                httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=20)
            )
        )
        asking.start()
        _wait_for(lambda: len(full.requests) == 1)
        server.should_exit = True
        asking.join(20)
        thread.join(20)
        _wait_for(lambda: full.disconnects == 1)
    (resp,) = answer
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    error = resp.json()["error"]
    assert error["code"] == "shutting_down" and error["type"] == "service_unavailable"
    assert "safe to send it again" in error["message"]
