"""The gateway image, built on a base made here from Debian's packages and run with podman:
the official `openai` client through the containerised gateway to real vLLM tiers (this
machine's embedded engine), the step recorded in a real SQLite store, and a clean stop on
SIGTERM. Skipped, with the reason, where this machine cannot build or run containers."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from bench.stack import StackError, free_port, serve
from tests.deploy.images import built, podman, runnable

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # e2e: starts vLLM, so it runs last


@pytest.fixture(scope="module")
def gateway_image() -> str:
    return runnable(built("gateway"))


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The embedded engine's two vLLM servers, started by `gearshift serve` on this host."""
    off = {"GEARSHIFT_STORE__ENABLED": "false", "GEARSHIFT_SANDBOX__ENABLED": "false"}
    log = tmp_path_factory.mktemp("tiers") / "serve.log"
    try:
        with serve(log, off, timeout_s=900) as stack:
            yield {"full": stack.full_url, "fast": stack.fast_url}
    except StackError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def container(gateway_image: str, tiers: dict[str, str], tmp_path: Path) -> Iterator[str]:
    port = free_port()
    home = tmp_path / "home"  # the gateway's writable home: store, dead letters, sockets
    home.mkdir()
    home.chmod(0o777)  # the image's user (uid 10001) writes here
    config = tmp_path / "gearshift.yaml"
    config.write_text(yaml.safe_dump({
        "host": "127.0.0.1", "port": port,
        "tiers": {"full": {"model": "smollm2-135m", "replicas": [tiers["full"]]},
                  "fast": {"model": "smollm2-135m-fast", "replicas": [tiers["fast"]]}},
        "store": {"url": "sqlite:////var/lib/gearshift/trajectories.db"},
    }))  # fmt: skip
    config.chmod(0o644)
    name = f"gearshift-test-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, "--network", "host", "--read-only",
           "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "-v", f"{config}:/etc/gearshift/gearshift.yaml:ro",
           "-v", f"{home}:/var/lib/gearshift", gateway_image)  # fmt: skip
    try:
        yield name
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)


def wait_ready(url: str, name: str, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        state = podman("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", podman("logs", name).stderr[-3000:]
        time.sleep(1)
    pytest.fail("the container never said ready:\n" + podman("logs", name).stderr[-3000:])


def test_openai_client_through_the_gateway_container(container: str, tmp_path: Path) -> None:
    config = yaml.safe_load((tmp_path / "gearshift.yaml").read_text())
    url = f"http://127.0.0.1:{config['port']}"
    wait_ready(url, container)
    assert podman("exec", container, "id", "-u").stdout.strip() == "10001"

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    models = {m.id for m in client.models.list()}
    assert {"auto", "smollm2-135m", "smollm2-135m-fast"} <= models
    answer = client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert answer.choices[0].message.content and answer.model in models

    podman("stop", "-t", "20", container, timeout=60)  # SIGTERM: drain, flush the store
    code = podman("inspect", "-f", "{{.State.ExitCode}}", container).stdout.strip()
    logs = podman("logs", container).stderr
    assert code == "0", logs[-3000:]
    # not root, so the sandbox it tries to start as its child cannot isolate tool code: it
    # says so and serves without tools (the sandbox runs in its own, root, container)
    assert "tools cannot run" in logs
    db = sqlite3.connect(tmp_path / "home" / "trajectories.db")
    try:
        tables = {row[0] for row in db.execute("select name from sqlite_master where type='table'")}
        assert "steps" in tables, tables
        assert db.execute("select count(*) from steps").fetchone()[0] == 1
    finally:
        db.close()
