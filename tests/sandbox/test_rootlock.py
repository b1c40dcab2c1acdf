"""One sandbox service per root (``sandbox.rootlock``): a second one refuses to start,
naming the root and the holder's pid, before it removes anything under the root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from sandbox.config import SandboxConfig
from sandbox.core import Sandbox
from sandbox.errors import RuntimeUnavailable
from sandbox.rootlock import LOCK_NAME

CANNOT_ISOLATE = 3  # python -m sandbox's exit status when it refuses to run code
WORKSPACE = "ab" * 16  # named like a workspace: what a start-up sweep removes


def service(config: SandboxConfig, where: Path) -> list[str]:
    section = {"token": "t", "root": str(config.root), "socket": str(where / "s.sock"),
               "warm": False, "pool": 0}  # fmt: skip
    (where / "sandbox.yaml").write_text(yaml.safe_dump({"sandbox": section}))
    return [sys.executable, "-m", "sandbox", "--config", str(where / "sandbox.yaml")]


async def test_a_second_service_on_the_root_refuses_before_it_sweeps(config: SandboxConfig):
    live = config.root / WORKSPACE
    with tempfile.TemporaryDirectory(prefix="gs-lock-") as d:  # short: a socket path
        argv = service(config, Path(d))
        first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while not (Path(d) / "s.sock").exists():  # serving: its own sweep is over
                assert first.poll() is None, first.communicate()[1]
                assert time.monotonic() < deadline, "the first service did not start"
                time.sleep(0.05)
            live.mkdir()
            second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            assert second.returncode == CANNOT_ISOLATE, second.stderr
            assert f"sandbox root {config.root} is in use" in second.stderr
            assert f"(pid {first.pid})" in second.stderr
            assert live.is_dir()  # the first service's workspace is untouched
        finally:
            first.send_signal(signal.SIGKILL)  # no clean shutdown: the kernel drops the lock
            first.wait()
    after = Sandbox(config)  # the holder is gone: the root is free, and swept
    assert not live.exists()
    await after.close()


async def test_one_sandbox_per_root_in_one_process_too(config: SandboxConfig):
    first = Sandbox(config)
    try:
        with pytest.raises(RuntimeUnavailable, match=f"pid {os.getpid()}"):
            Sandbox(config.model_copy(update={"warm": False}))
        assert (config.root / LOCK_NAME).read_text().strip() == str(os.getpid())
    finally:
        await first.close()
    again = Sandbox(config)  # closed: the root is free
    await again.close()
