"""`gearshift serve` and `gearshift sandbox` as processes of their own, for the deployment
tests: each from this checkout, its output in a log file, stopped (its whole process group)
on exit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CANNOT_ISOLATE = 3  # python -m sandbox's exit status


def environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEARSHIFT_")}
    env["GEARSHIFT_HOME"] = str(tmp)
    return env


def start(tmp: Path, name: str, *argv: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli.main", "--log-level", "info", *argv],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
            env=environment(tmp),
        )  # fmt: skip
    return proc, log


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def gateway(tmp: Path, name: str, config: dict[str, Any]) -> Iterator[Gateway]:
    """`gearshift serve` with ``config`` (its port chosen here), once it is ready."""
    port = free_port()
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"port": port, **config}))
    proc, log = start(tmp, name, "serve", "--config", str(path))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/ready", proc, log)
        yield Gateway(url, proc, log)
    finally:
        stop(proc)


@contextlib.contextmanager
def sandbox_service(tmp: Path, root: Path, token_file: Path) -> Iterator[str]:
    """The real tool sandbox, `gearshift sandbox`, on a loopback port with its token from a
    file; skips the test where the host cannot isolate code (not root, no bubblewrap)."""
    port = free_port()
    path = tmp / "sandbox.yaml"
    path.write_text(yaml.safe_dump({"sandbox": {
        "host": "127.0.0.1", "port": port, "root": str(root), "token_file": str(token_file),
        "grants_by_tenant": {"default": {"tools": ["run_python"]}},
    }}))  # fmt: skip
    proc, log = start(tmp, "sandbox", "sandbox", "--config", str(path))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() == CANNOT_ISOLATE:
                pytest.skip(f"the sandbox cannot isolate code here: {log.read_text()[-500:]}")
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        stop(proc)
