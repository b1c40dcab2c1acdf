"""deploy/compose.yaml brought up for real with podman-compose (or docker compose), without
the profile `full` (its three public images need a registry): the gateway, the sandbox and
the two CPU vLLM tiers from the locally built images, the store in SQLite. The official
client gets a chat completion through the gateway's /ready-checked service; then it all
comes down. Skipped, saying why, where the tools, the images or the models are not here."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.deploy.manifests import DEPLOY

pytestmark = pytest.mark.slow
IMAGES = ("localhost/gearshift-gateway:0.1.0", "localhost/gearshift-vllm-cpu:0.1.0")
PORTS = (8000, 8101, 8102, 8200)  # compose's fixed loopback ports
MODELS = Path(os.environ.get("GEARSHIFT_MODELS", "~/.cache/gearshift/models")).expanduser()


def compose_command() -> list[str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    if (found := shutil.which("podman-compose")) is not None:
        return [found]
    if (
        shutil.which("docker") is not None
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):  # the docker CLI without its compose plugin cannot run this
        return ["docker", "compose"]
    pytest.skip(
        "neither podman-compose nor docker compose is installed (pip install podman-compose)"
    )


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_compose_comes_up_offline_and_serves_the_openai_client(tmp_path: Path) -> None:
    command = compose_command()
    env = {**os.environ, "CONTAINERS_CONF": str(DEPLOY / "podman" / "containers.conf")}
    for image in IMAGES:
        if subprocess.run(["podman", "image", "exists", image], env=env, check=False).returncode:
            pytest.skip(f"{image} is not built (scripts/build-images.sh gateway vllm-cpu)")
    if not list(MODELS.glob("smollm2-135m-instruct-*")):
        pytest.skip(f"no converted model in {MODELS} (gearshift provision)")
    if taken := [p for p in PORTS if _port_taken(p)]:
        pytest.skip(f"compose's ports {taken} are in use on 127.0.0.1")

    # a copy of deploy/'s compose part: its secrets are this test's own
    shutil.copy2(DEPLOY / "compose.yaml", tmp_path / "compose.yaml")
    shutil.copytree(
        DEPLOY / "compose", tmp_path / "compose", ignore=shutil.ignore_patterns("secrets")
    )
    made = subprocess.run([str(tmp_path / "compose" / "make-secrets.sh"), "--sqlite"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    project = f"gs-compose-{uuid.uuid4().hex[:8]}"
    base = [*command, "-p", project, "-f", str(tmp_path / "compose.yaml")]
    log = tmp_path / "compose.log"

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*base, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=timeout, check=False)  # fmt: skip
        with log.open("a") as f:
            f.write(f"$ {' '.join(args)}\n{done.stdout}\n{done.stderr}\n")
        return done

    passed = False
    try:
        up = run("up", "-d")
        assert up.returncode == 0, log.read_text()[-4000:]
        deadline = time.monotonic() + 900
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get("http://127.0.0.1:8000/ready", timeout=3).status_code == 200:
                    break
            if time.monotonic() > deadline:
                run("logs", "--tail", "40", timeout=60)
                pytest.fail("the gateway never became ready:\n" + log.read_text()[-6000:])
            time.sleep(3)
        client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
        )
        assert answer.choices[0].message.content
        assert answer.model in ("smollm2-135m", "smollm2-135m-fast")
        tools = httpx.get("http://127.0.0.1:8000/v1/tools", timeout=30)
        assert tools.status_code == 200, tools.text  # the sandbox container, as sandbox.external
        passed = True
    finally:
        if not passed:  # the containers' own words, before `down` removes them
            for service in ("gateway", "sandbox", "vllm-full", "vllm-fast"):
                logs = run("logs", "--tail", "30", service, timeout=60)
                print(f"== {service}\n{logs.stdout[-3000:]}\n{logs.stderr[-3000:]}")
        run("down", "-v", timeout=300)
