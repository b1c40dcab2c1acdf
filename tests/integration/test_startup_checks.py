"""`gearshift serve`'s start-up checks: a failed one stops the process (or, where a tier says
``family_check: warn``, is logged), ``/ready`` is 503 until they pass, and SIGTERM/SIGINT
stop the process in every phase.

The gateway runs as a real process in front of fake replicas on 127.0.0.1 whose ``/tokenize``
answers as scripted (issue #29: a replica that did not answer it in vLLM's shape left the
process half-dead, ``/ready`` 200, every request a 500, and deaf to SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from gateway.cli import serve
from gateway.config import Settings, TierSettings
from gateway.upstream.family_probe import check_replica_family, family_problems
from router import Tier
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread

CHAT_ANSWER = {"id": "x", "object": "chat.completion", "choices": [], "model": "m"}
BAD_ANSWERS = {
    "chat completion": (200, orjson.dumps(CHAT_ANSWER)),
    "not JSON": (200, b"<html>proxy login</html>"),
    "an error status": (404, b'{"detail": "Not Found"}'),
    "token ids as strings": (200, b'{"tokens": ["a", "b"], "count": 2}'),
    "a JSON list": (200, b"[1, 2, 3]"),
}


class Tokenizer:
    """A fake replica whose ``/tokenize`` answers as told: vLLM's answer (``ok``), one of
    ``BAD_ANSWERS``, after ``delay_s``, or not until ``release`` is set (``stall``)."""

    def __init__(self, answer: str = "ok", delay_s: float = 0.0) -> None:
        self.upstream = FakeUpstream()
        self.answer = answer
        self.delay_s = delay_s
        self.release = threading.Event()
        self.asked = 0
        self.answered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/tokenize":
            await self.upstream.app(scope, receive, send)
            return
        self.asked += 1
        request = Request(scope, receive)
        body = await request.body()  # before is_disconnected, which would consume it
        deadline = time.monotonic() + (60.0 if self.answer == "stall" else self.delay_s)
        while time.monotonic() < deadline and not self.release.is_set():
            if await request.is_disconnected():
                return
            await asyncio.sleep(0.02)
        self.answered += 1
        if self.answer in BAD_ANSWERS:
            code, body = BAD_ANSWERS[self.answer]
            await send({"type": "http.response.start", "status": code, "headers": []})
            await send({"type": "http.response.body", "body": body})
        else:
            await self.upstream.app(scope, _replay(body), send)


def _replay(body: bytes) -> Receive:
    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


class Gateway:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log_path = proc, url, log

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running after {timeout} s:\n{self.log()[-3000:]}"
            ) from None

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.ready_status() != 200:
            assert self.proc.poll() is None, f"gearshift serve exited:\n{self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready:\n{self.log()[-3000:]}"
            time.sleep(0.1)

    def ready_status(self) -> int | None:
        try:
            return httpx.get(self.url + "/ready", timeout=2).status_code
        except httpx.HTTPError:
            return None


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """Starts `gearshift serve` with both tiers on the given replica; kills it at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(replica: str, family_check: str = "required") -> Gateway:
        port = free_port()
        tier: dict[str, Any] = {"replicas": [replica], "family_check": family_check}
        config = tmp_path / f"gearshift-{port}.yaml"
        config.write_text(yaml.safe_dump({
            "tiers": {"full": {"model": "m", **tier}, "fast": {"model": "m-fast", **tier}},
            "health": {"interval_s": 0.2, "timeout_s": 0.5},
            "router": {"calibrate_tokens": False},
            "store": {"url": f"sqlite:///{tmp_path}/store-{port}.db"},
            "sandbox": {"enabled": False},
        }))  # fmt: skip
        log = tmp_path / f"serve-{port}.log"
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("gearshift")), "serve", "--config", str(config), "--port", str(port)],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        started.append(proc)
        return Gateway(proc, f"http://127.0.0.1:{port}", log)

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# --- the probe: every failure is a named problem, never an exception ---


@pytest.mark.parametrize("answer", list(BAD_ANSWERS))
def test_a_bad_tokenize_answer_is_a_named_problem(answer: str):
    with serve_in_thread(Tokenizer(answer)) as url:
        tiers = {
            Tier.FULL: TierSettings(model="m", replicas=[url]),
            Tier.FAST: TierSettings(model="m-fast", replicas=[url], family_check="warn"),
        }
        problems = asyncio.run(family_problems(tiers))
    assert [p.tiers for p in problems] == [(Tier.FULL,), (Tier.FAST,)]
    assert problems[0].message.startswith(f"tier full: replica {url}: POST /tokenize answered")
    assert problems[0].required(tiers) and not problems[1].required(tiers)


def test_an_unreachable_or_silent_replica_is_a_named_problem():
    with serve_in_thread(Tokenizer("stall")) as silent:
        dead = f"http://127.0.0.1:{free_port()}"
        tiers = {
            Tier.FULL: TierSettings(model="m", replicas=[dead]),
            Tier.FAST: TierSettings(model="m-fast", replicas=[silent]),
        }
        full, fast = asyncio.run(check_replica_family(tiers, timeout_s=0.5))
    assert full.startswith(
        f"tier full: replica {dead}: POST /tokenize failed: ClientConnectorError"
    )
    assert fast == f"tier fast: replica {silent}: POST /tokenize did not answer within 0.5 s"


# --- the process ---


def test_a_bad_tokenize_answer_stops_serve_naming_the_problem(start_gateway):
    with serve_in_thread(Tokenizer("chat completion")) as replica:
        gateway = start_gateway(replica)
        assert gateway.wait_exit(20) == 1
    log = gateway.log()
    assert (
        f"tier full: replica {replica}: POST /tokenize answered without a list of token ids" in log
    )
    assert "refusing to serve" in log and "family_check: warn" in log
    assert "Gearshift ready" not in log and "Traceback" not in log


def test_family_check_warn_serves_and_logs_a_warning(start_gateway):
    tokenizer = Tokenizer("chat completion")
    with serve_in_thread(tokenizer) as replica:
        gateway = start_gateway(replica, family_check="warn")
        gateway.wait_ready()
        answer = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "hello from fake"
    log = gateway.log()
    assert "WARNING" in log and "serving anyway (family_check: warn)" in log
    assert f"tier full: replica {replica}: POST /tokenize answered without" in log
    assert "Gearshift ready" in log


def test_ready_is_503_until_the_checks_pass(start_gateway):
    tokenizer = Tokenizer("ok", delay_s=0.5)
    with serve_in_thread(tokenizer) as replica:
        gateway = start_gateway(replica)
        _wait_for(lambda: tokenizer.asked > 0, "the family check never started")
        answer = httpx.get(gateway.url + "/ready", timeout=2)
        assert answer.status_code == 503
        assert answer.json()["reason"] == "the start-up checks have not finished"
        assert answer.json()["tiers"]["full"]["replicas"][0]["healthy"]  # the replicas are fine
        statuses = []
        while (status := gateway.ready_status()) != 200:
            assert gateway.proc.poll() is None, gateway.log()
            statuses.append(status)
            time.sleep(0.05)
        assert tokenizer.answered == 4  # both tiers, text and conversation, before the 200
        assert set(statuses) == {503}
    assert "Gearshift ready" in gateway.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("phase", ["serving", "check stalled"])
def test_a_signal_stops_serve_in_every_phase(start_gateway, sig: signal.Signals, phase: str):
    tokenizer = Tokenizer("ok" if phase == "serving" else "stall")
    with serve_in_thread(tokenizer) as replica:
        gateway = start_gateway(replica)
        if phase == "serving":
            gateway.wait_ready()
        else:
            _wait_for(lambda: tokenizer.asked > 0, "the family check never started")
            assert gateway.ready_status() == 503
        gateway.proc.send_signal(sig)
        code = gateway.wait_exit(15)  # the drain is at most 10 s; nothing is in flight here
        tokenizer.release.set()
    assert code == 0, gateway.log()[-3000:]
    assert "Gearshift stopped" in gateway.log()


# --- a start-up step that raises ---


def test_a_start_up_step_that_raises_stops_serve(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
):
    async def broken(tiers: object) -> object:
        raise RuntimeError("a bug in a start-up step")

    monkeypatch.setattr(serve, "family_problems", broken)
    port = free_port()
    with serve_in_thread(FakeUpstream().app) as replica:
        settings = Settings(
            port=port,
            tiers={
                "full": {"model": "m", "replicas": [replica]},
                "fast": {"model": "m-fast", "replicas": [replica]},
            },
            health={"interval_s": 0.2},
            router={"calibrate_tokens": False},
            store={"enabled": False},
            sandbox={"enabled": False},
        )
        code = asyncio.run(asyncio.wait_for(serve.run(settings), 20))
    assert code == 1
    assert "a start-up step failed: RuntimeError: a bug in a start-up step" in caplog.text
    with pytest.raises(httpx.ConnectError):  # nothing left listening
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
