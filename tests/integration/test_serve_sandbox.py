"""`gearshift serve` starts the tool sandbox on a Unix socket, and it dies with the gateway."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from sandbox.client import SandboxClient
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread


def test_serve_runs_the_sandbox_and_it_dies_with_the_gateway(tmp_path: Path):
    root = Path(tempfile.mkdtemp(prefix="gearshift-sbx-serve-"))
    os.chmod(root, 0o711)
    socket = root / "sandbox.sock"
    port = free_port()
    try:
        with serve_in_thread(FakeUpstream().app) as replica:
            config = tmp_path / "gearshift.yaml"
            config.write_text(yaml.safe_dump({
                "tiers": {"full": {"model": "m", "replicas": [replica]}},
                "store": {"url": f"sqlite:///{tmp_path}/s.db"},
                "sandbox": {"token": "serve-token", "socket": str(socket), "root": str(root / "ws"),
                            "grants_by_tenant": {"default": {"tools": ["run_python"]}}},
            }))  # fmt: skip
            gearshift = Path(sys.executable).with_name("gearshift")
            log = (tmp_path / "serve.log").open("wb")
            proc = subprocess.Popen(
                [str(gearshift), "serve", "--config", str(config), "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 60
                while True:
                    assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                    try:
                        if (
                            httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code
                            == 200
                        ):
                            break
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                    time.sleep(0.2)
                assert "tool sandbox ready" in (tmp_path / "serve.log").read_text()
                out = asyncio.run(_one_call(str(socket)))
                assert out == "42\n"
                sandbox_pids = subprocess.run(
                    # this gateway's own child (other gateways may run sandboxes meanwhile)
                    ["pgrep", "-P", str(proc.pid), "-f", "--", "-m sandbox --config"],
                    capture_output=True,
                    text=True,
                ).stdout.split()
                assert sandbox_pids
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            deadline = time.monotonic() + 10
            while any(Path(f"/proc/{p}").exists() for p in sandbox_pids):
                assert time.monotonic() < deadline, "the sandbox outlived a kill -9 of the gateway"
                time.sleep(0.1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _one_call(socket: str) -> str:
    client = SandboxClient("", "serve-token", socket=socket)
    try:
        sid = await client.create_session("default", "anonymous")
        result = await client.call(
            "default", "anonymous", sid, "run_python", {"code": "print(6*7)"}
        )
        return result.stdout
    finally:
        await client.close()
