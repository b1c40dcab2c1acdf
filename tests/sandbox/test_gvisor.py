"""The OCI spec the gVisor runtime generates (no runsc needed), and the grant's process limit
inside gVisor (with runsc)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from sandbox.config import SandboxConfig
from sandbox.core import Sandbox
from sandbox.policy import ResourceClass
from sandbox.runtime import seccomp
from sandbox.runtime.base import RUN_ENV
from sandbox.runtime.gvisor import HOST_PIDS_FLOOR, RunscRuntime
from tests.sandbox.conftest import EVERYTHING, Harness

LIMITS = ResourceClass(cpu_s=3, memory_mb=128, pids=32, wall_s=5, output_bytes=4096, file_mb=2)


def spec(limits: ResourceClass = LIMITS) -> dict:
    return RunscRuntime().spec(["python3", "-c", "pass"], Path("/ws"), limits)


def test_the_grants_limits_are_what_gvisor_enforces():
    s = spec()
    rlimits = {r["type"]: (r["soft"], r["hard"]) for r in s["process"]["rlimits"]}
    assert rlimits == {
        "RLIMIT_NPROC": (32, 32),  # gVisor's kernel counts the run's threads and processes
        "RLIMIT_CPU": (3, 4),
        "RLIMIT_FSIZE": (2 << 20, 2 << 20),
        "RLIMIT_NOFILE": (256, 256),
        "RLIMIT_CORE": (0, 0),
    }
    resources = s["linux"]["resources"]
    assert resources["memory"] == {"limit": 128 << 20}
    # The host cgroup also holds gVisor's own threads: there the floor applies, not the grant.
    assert resources["pids"] == {"limit": HOST_PIDS_FLOOR}
    many = ResourceClass(cpu_s=3, memory_mb=128, pids=4000, wall_s=5, output_bytes=4096, file_mb=2)
    assert spec(many)["linux"]["resources"]["pids"] == {"limit": 4000}


def test_the_projects_seccomp_profile_goes_into_the_spec():
    assert spec()["linux"]["seccomp"] == seccomp.oci()


def test_the_run_gets_only_its_own_environment_as_an_unprivileged_user():
    p = spec()["process"]
    assert p["env"] == [f"{k}={v}" for k, v in RUN_ENV.items()]
    assert p["user"] == {"uid": 65534, "gid": 65534} and p["noNewPrivileges"] is True
    assert spec()["root"]["readonly"] is True
    assert {"type": "network"} in spec()["linux"]["namespaces"]


@pytest.fixture
async def gvisor(config: SandboxConfig):
    if shutil.which("runsc") is None:
        pytest.skip("gVisor (runsc) is not installed here: the spec tests above still ran")
    sandbox = Sandbox(config.model_copy(update={"runtime": "gvisor", "warm": False}))
    yield Harness(sandbox, "gvisor")
    for sid in list(sandbox.sessions):
        await sandbox.remove(sid)


async def test_threads_are_capped_at_the_grants_pids(gvisor: Harness):
    r = await gvisor.py(
        "import threading\nev = threading.Event()\nn = 0\ntry:\n"
        "    for _ in range(1000):\n        threading.Thread(target=ev.wait, daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError:\n    pass\nev.set()\nprint(n)"
    )
    assert 0 < int(r.stdout) < EVERYTHING.resources.pids, r  # 1,000 before the fix


def _runsc_environments(runsc: str) -> list[bytes]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "cmdline").read_bytes().split(b"\0")[0] == runsc.encode():
                found.append((proc / "environ").read_bytes())
        except OSError:
            continue  # gone, or not a process
    return found


async def test_neither_runsc_nor_the_run_holds_the_services_environment(
    gvisor: Harness, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GEARSHIFT_PLANTED_SECRET", "do-not-leak")
    call = asyncio.create_task(gvisor.sh("sleep 1.5; cat /proc/*/environ | tr '\\0' '\\n'; env"))
    await asyncio.sleep(0.8)
    host = _runsc_environments(str(shutil.which("runsc")))
    r = await call
    assert host and not any(b"do-not-leak" in env for env in host)
    assert "do-not-leak" not in r.stdout and "PATH=/usr/bin:/bin" in r.stdout
