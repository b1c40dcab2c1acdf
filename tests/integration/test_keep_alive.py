"""Idle client connections: ``gearshift serve`` keeps them open for ``timeouts.client_idle_s``.

uvicorn's own default (5 s) is shorter than aiohttp's pool (15 s): a client that reuses a
pooled connection just as the server drops it gets "server disconnected" instead of an
answer (seen from bench.router_outcomes while HumanEval checks kept connections idle).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gateway.cli.serve import uvicorn_config
from gateway.config import Settings
from tests.integration.test_crash import _wait_ready
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread

REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _ask(sock: socket.socket) -> bytes:
    """One request on the open connection; the whole response, read to its Content-Length
    (headers and body may arrive in separate reads)."""
    sock.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection mid-response"
        body += chunk
    assert len(body) == length  # nothing left over for the next read
    return head


def test_default_outlasts_client_pools():
    settings = Settings()
    config = uvicorn_config(settings, app=None)
    assert config.timeout_keep_alive == settings.timeouts.client_idle_s == 75


def test_idle_connection_is_reused_until_client_idle_s(tmp_path: Path):
    port = free_port()
    with serve_in_thread(FakeUpstream().app) as replica:
        config = tmp_path / "gearshift.yaml"
        config.write_text(yaml.safe_dump({
            "tiers": {"full": {"model": "m", "replicas": [replica]}},
            "store": {"enabled": False}, "sandbox": {"enabled": False},
            "timeouts": {"client_idle_s": 2},
        }))  # fmt: skip
        gearshift = Path(sys.executable).with_name("gearshift")
        proc = subprocess.Popen(
            [str(gearshift), "serve", "--config", str(config), "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_ready(f"http://127.0.0.1:{port}", proc)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                assert _ask(sock).startswith(b"HTTP/1.1 200")
                time.sleep(1.0)  # idle, but within client_idle_s: the same connection answers
                assert _ask(sock).startswith(b"HTTP/1.1 200")
                time.sleep(3.5)  # past client_idle_s: the server has closed it
                assert sock.recv(4096) == b""
        finally:
            proc.terminate()
            proc.wait(30)
