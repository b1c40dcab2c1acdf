"""One launcher for the real embedded stack: ``gearshift serve`` with two vLLM servers.

``serve`` starts it on free ports (the gateway's, and each tier's vLLM server's) with
``GEARSHIFT_*`` environment overrides, writes its output to a log file, waits for
``/ready``, and on exit stops it with SIGINT (then kills it after a minute).
``embedded_stack`` is the benchmarks' form: store and sandbox off, the log in a
temporary folder. The end-to-end tests (tests/e2e/conftest.py) use ``serve`` too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.procs import wait_http


class StackError(RuntimeError):
    """The stack exited or did not become ready in time (the message ends with its log)."""


@dataclass(frozen=True)
class Stack:
    url: str  # the gateway
    full_url: str  # the full tier's vLLM server
    fast_url: str  # the fast tier's vLLM server
    log_path: Path
    env: Mapping[str, str]  # what ``gearshift serve`` was started with
    pid: int = 0  # gearshift serve's (its vLLM servers are its children)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    proc.send_signal(signal.SIGINT)  # lets the gateway stop its vLLM servers
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve(
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    full_port: int | None = None,
    fast_port: int | None = None,
    timeout_s: float = 3600,
) -> Iterator[Stack]:
    """``gearshift serve`` on free ports, ``env`` over this process's environment (the
    tiers' ports are set here unless ``env`` names them). Raises StackError when it
    exits or is not ready after ``timeout_s``."""
    port = free_port()
    full_port, fast_port = full_port or free_port(), fast_port or free_port()
    full_env = {
        **os.environ,
        "GEARSHIFT_EMBEDDED__FULL_PORT": str(full_port),
        "GEARSHIFT_EMBEDDED__FAST_PORT": str(fast_port),
        **(env or {}),
    }
    gearshift = Path(sys.executable).with_name("gearshift")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(gearshift), "serve", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/ready", proc, log_path, timeout_s=timeout_s)
        except RuntimeError as exc:
            raise StackError(f"gearshift serve: {exc}") from None
        yield Stack(
            url,
            f"http://127.0.0.1:{full_env['GEARSHIFT_EMBEDDED__FULL_PORT']}",
            f"http://127.0.0.1:{full_env['GEARSHIFT_EMBEDDED__FAST_PORT']}",
            log_path,
            full_env,
            proc.pid,
        )
    finally:
        _stop(proc)


@contextlib.contextmanager
def embedded_stack(
    env: Mapping[str, str] | None = None,
    label: str = "",
    *,
    full_port: int | None = None,
    fast_port: int | None = None,
) -> Iterator[str]:
    """The stack for a benchmark (store and sandbox off, its log in a temporary folder):
    yields its URL once ready. ``full_port``, ``fast_port``: where the tiers' vLLM servers
    listen, for a caller that talks to them directly."""
    off = {"GEARSHIFT_STORE__ENABLED": "false", "GEARSHIFT_SANDBOX__ENABLED": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{label}starting the stack (provisioning the fast tier if needed)", flush=True)
        log = Path(tmp) / "serve.log"
        with serve(log, {**(env or {}), **off}, full_port=full_port, fast_port=fast_port) as s:
            yield s.url
