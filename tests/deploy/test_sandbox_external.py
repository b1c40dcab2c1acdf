"""``sandbox.external``: a gateway uses a sandbox service it did not start (its own container
or pod in a deployment; here its own process), with the token from a secret file. Start-up
checks the service and refuses, saying why, when it is down or refuses the token."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import SecretStr

from gateway.cli.sandbox_process import check_external
from sandbox.config import SandboxConfig
from tests.deploy.processes import gateway, sandbox_service, start, stop
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread

TOKEN = "external-sandbox-token-5c1f"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "sandbox-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def workspaces() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gearshift-sbx-ext-"))
    os.chmod(root, 0o711)  # the sandbox uid must reach the workspaces under it
    yield root / "ws"
    shutil.rmtree(root, ignore_errors=True)


def config(replica: str, tmp: Path, sandbox: dict[str, object]) -> dict[str, object]:
    return {
        "tiers": {"full": {"model": "m", "replicas": [replica]}},
        "store": {"url": f"sqlite:///{tmp}/store.db", "dead_letter_path": str(tmp / "dl.jsonl")},
        "router": {"calibrate_tokens": False},
        "sandbox": sandbox,
    }


def test_the_gateway_runs_tools_in_a_sandbox_it_did_not_start(
    tmp_path: Path, token_file: Path, workspaces: Path
) -> None:
    with (
        sandbox_service(tmp_path, workspaces, token_file) as sandbox,
        serve_in_thread(FakeUpstream().app) as replica,
        gateway(
            tmp_path,
            "gw",
            config(
                replica,
                tmp_path,
                {
                    "external": sandbox,
                    "token_file": str(token_file),
                    "external_wait_s": 30,
                },
            ),
        ) as gw,  # fmt: skip
    ):
        url, log = gw.url, gw.log.read_text()
        assert f"tool sandbox at {sandbox} ready" in log
        # it started no sandbox of its own (that would log either of these)
        assert "tool sandbox ready on unix:" not in log and "sandbox not started" not in log
        names = [t["function"]["name"] for t in httpx.get(url + "/v1/tools").json()["data"]]
        assert "run_python" in names
        ran = httpx.post(
            url + "/v1/tools/run_python", json={"arguments": {"code": "print(6*7)"}},
            headers={"x-session-id": "ext-1"}, timeout=60,
        )  # fmt: skip
        assert ran.status_code == 200, ran.text
        assert ran.json()["stdout"] == "42\n"
        assert TOKEN not in (tmp_path / "gw.log").read_text()

        wrong = tmp_path / "wrong-token"
        wrong.write_text("not-the-token")
        log = _refused(tmp_path, "wrong", config(replica, tmp_path, {
            "external": sandbox, "token_file": str(wrong), "external_wait_s": 30,
        }))  # fmt: skip
        assert f"sandbox.external {sandbox} refused the token" in log, log[-2000:]
        assert "not-the-token" not in log and TOKEN not in log


def _refused(tmp: Path, name: str, cfg: dict[str, object]) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"port": free_port(), **cfg}))
    proc, log = start(tmp, name, "serve", "--config", str(path))
    try:
        assert proc.wait(90) == 1, log.read_text()[-3000:]
    finally:
        stop(proc)
    return log.read_text()


def test_start_up_refuses_a_down_sandbox() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    cfg = SandboxConfig(external=down, token=SecretStr(TOKEN))
    started = time.monotonic()
    problem = asyncio.run(check_external(cfg, timeout_s=1.0))
    assert problem is not None and time.monotonic() - started < 10
    assert problem.startswith(f"sandbox.external {down} did not answer within 1 s")
    assert "start the sandbox service (`gearshift sandbox`) or fix the URL" in problem


def test_external_needs_a_token(tmp_path: Path) -> None:
    from gateway.config import load_settings

    path = tmp_path / "g.yaml"
    path.write_text("sandbox: {external: 'http://127.0.0.1:8200'}\n")
    with pytest.raises(Exception, match=r"sandbox\.external needs the service's token"):
        load_settings(path)
    path.write_text("sandbox: {external: 'tcp://x', token: t}\n")
    with pytest.raises(Exception, match="must start with http"):
        load_settings(path)
