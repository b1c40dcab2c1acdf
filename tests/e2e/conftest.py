"""The real embedded stack: `gearshift serve` with two vLLM servers and the default model."""

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

import httpx
import openai
import pytest

from tests.support.servers import free_port

STARTUP_TIMEOUT_S = 900


@dataclass
class RealStack:
    url: str
    full_url: str
    fast_url: str
    log_path: Path
    store_url: str

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120, **kw
        )


@contextlib.contextmanager
def start_stack(log_dir: Path, **embedded: str) -> Iterator[RealStack]:
    """`gearshift serve` on free ports with GEARSHIFT_EMBEDDED__* overrides; stopped on exit."""
    port, full_port, fast_port = free_port(), free_port(), free_port()
    log_path = log_dir / "gearshift-serve.log"
    env = {
        **os.environ,
        "GEARSHIFT_EMBEDDED__FULL_PORT": str(full_port),
        "GEARSHIFT_EMBEDDED__FAST_PORT": str(fast_port),
        "GEARSHIFT_EMBEDDED__MAX_RESTARTS": "2",
        "GEARSHIFT_TELEMETRY__SCRAPE_INTERVAL_S": "1",
        "GEARSHIFT_STORE__URL": f"sqlite:///{log_dir}/trajectories.db",
        "GEARSHIFT_STORE__DEAD_LETTER_PATH": str(log_dir / "dead-letter.jsonl"),
        **{f"GEARSHIFT_EMBEDDED__{k.upper()}": v for k, v in embedded.items()},
    }
    gearshift = Path(sys.executable).with_name("gearshift")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(gearshift), "serve", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    stack = RealStack(
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{full_port}",
        f"http://127.0.0.1:{fast_port}",
        log_path,
        env["GEARSHIFT_STORE__URL"],
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"gearshift serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            try:
                if httpx.get(stack.url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"stack not ready after {STARTUP_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(1)
        yield stack
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    """The default stack: the fast tier serves the pruned model (fast_mode: lossy)."""
    with start_stack(tmp_path_factory.mktemp("e2e")) as stack:
        yield stack
