"""``gearshift serve``'s sandbox child inherits only what the gateway names: a few
environment variables and its standard streams, never the gateway's secrets."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gateway.cli.sandbox_process import PASSED_ENV, environment, start_sandbox
from gateway.config import EmbeddedSettings, Settings
from sandbox.config import SandboxConfig

CANARY = "postgresql://gearshift:secret-xyz-91ab@db/store"


def test_only_the_named_variables_pass():
    gateway_env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "GEARSHIFT_STORE__URL": CANARY,
                   "OPENAI_API_KEY": "sk-x", "TMPDIR": "/var/tmp"}  # fmt: skip
    assert environment(gateway_env) == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "TMPDIR": "/var/tmp"}


async def test_the_sandbox_service_starts_without_the_gateways_environment_and_descriptors(
    sandbox_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.fail("the sandbox needs root and bubblewrap: run ./scripts/install.sh")
    settings = Settings(
        sandbox=SandboxConfig(token="t", root=sandbox_root),
        embedded=EmbeddedSettings(home=tmp_path),
    )
    monkeypatch.setenv("GEARSHIFT_CANARY", CANARY)
    planted = os.open(tmp_path / "gateway-secret", os.O_CREAT | os.O_RDWR, 0o600)
    os.set_inheritable(planted, True)
    try:
        sandbox = await start_sandbox(settings)
        assert sandbox is not None, "the sandbox service did not start"
        try:
            pid = sandbox.proc.pid
            raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
            env = dict(v.split("=", 1) for v in raw.split("\0") if v)
            assert CANARY not in raw and set(env) <= set(PASSED_ENV) and "PATH" in env
            fd_dir = Path(f"/proc/{pid}/fd")
            targets = {os.readlink(fd_dir / n) for n in os.listdir(fd_dir)}
            assert str(tmp_path / "gateway-secret") not in targets
        finally:
            await sandbox.stop()
    finally:
        os.close(planted)


def test_the_standalone_sandbox_gets_the_configured_token_not_its_mask():
    """``gearshift sandbox --config`` writes the section for the service: a plain dump would
    write the SecretStr as ``**********``, and that string would become the secret."""
    import yaml

    from gateway.cli.sandbox_process import write_section

    path = write_section(SandboxConfig(token="a-real-shared-secret-42"))
    try:
        written = yaml.safe_load(path.read_text())["sandbox"]
        assert written["token"] == "a-real-shared-secret-42"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    finally:
        path.unlink()
    with pytest.raises(ValueError, match="masked placeholder"):
        SandboxConfig(token="**********")
