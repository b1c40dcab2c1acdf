"""`kill -9` of the gateway under load loses no step it acknowledged as recorded.

A step is acknowledged when ``GET /v1/steps/{id}`` answers 200: that read is
queued behind the step's write and runs after its commit. The gateway runs as
a real process (``gearshift serve``) in front of a fake replica; clients keep
sending and confirming until the process is killed.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread


def test_sigkill_under_load_keeps_every_acknowledged_step(tmp_path: Path):
    db = tmp_path / "store.db"
    port = free_port()
    with serve_in_thread(FakeUpstream().app) as replica:
        config = tmp_path / "gearshift.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "tiers": {"full": {"model": "m", "replicas": [replica]}},
                    "store": {"url": f"sqlite:///{db}", "batch_size": 16},
                    "sandbox": {"enabled": False},
                }
            )
        )
        gearshift = Path(sys.executable).with_name("gearshift")
        log = (tmp_path / "serve.log").open("wb")
        proc = subprocess.Popen(
            [str(gearshift), "--log-level", "warning", "serve", "--config", str(config), "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc)
            acked: list[str] = []
            sent = [0]
            stop = threading.Event()
            workers = [
                threading.Thread(target=_client, args=(url, i, acked, sent, stop)) for i in range(6)
            ]
            for w in workers:
                w.start()
            deadline = time.monotonic() + 60
            while len(acked) < 150 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)  # mid-load: requests and writes in flight
            proc.wait(10)
            stop.set()
            for w in workers:
                w.join(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert len(acked) >= 150, (tmp_path / "serve.log").read_text()[-2000:]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {row[0] for row in conn.execute("SELECT id FROM steps")}
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged steps lost of {len(acked)}"
    assert len(stored) >= len(acked)  # steps written but not yet confirmed survive too


def _wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "gearshift serve exited"
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("gateway not ready")


def _client(url: str, n: int, acked: list[str], sent: list[int], stop: threading.Event) -> None:
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            try:
                r = client.post(
                    url + "/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": f"{n}-{sent[0]}"}],
                    },
                )
                sent[0] += 1
                step = r.headers["x-gearshift-step-id"]
                if client.get(url + f"/v1/steps/{step}").status_code == 200:
                    acked.append(step)
            except (httpx.HTTPError, KeyError):
                return  # the gateway is gone
