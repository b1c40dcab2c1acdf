"""Nothing of the service reaches a run: no variable of its environment and no descriptor it
holds, in any process the tool code can see (bubblewrap's process 1 included), cold, warm
and under gVisor."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from sandbox.config import SandboxConfig
from sandbox.core import Sandbox
from sandbox.runtime.base import RUN_ENV
from sandbox.runtime.warm_runner import REPORT_FD
from tests.sandbox.conftest import Harness

CANARY = "secret-xyz-4f1c"
# The run's own variables: RUN_ENV, and the PWD bubblewrap sets when it enters /workspace.
OWN = {**RUN_ENV, "PWD": "/workspace"}

# Run inside: every process's environment and open descriptors, as far as /proc shows them.
PROBE = r"""
import json, os
def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode("latin-1")
    except OSError:
        return None  # not ours to read (the warm runner is not dumpable)
def fds(pid):
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    out = {}
    for fd in names:
        try:
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass  # the descriptor os.listdir used, closed since
    return out
pids = sorted(p for p in os.listdir("/proc") if p.isdigit())
print(json.dumps({"me": str(os.getpid()),
                  "procs": {p: {"environ": environ(p), "fds": fds(p)} for p in pids}}))
"""


def _planted_descriptors(tmp_path: Path) -> tuple[int, socket.socket]:
    """An inheritable file and listening socket in the service, as a careless one has."""
    fd = os.open(tmp_path / "service-secret", os.O_CREAT | os.O_RDWR, 0o600)
    os.set_inheritable(fd, True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.set_inheritable(True)
    return fd, listener


def _expected_target(target: str, pid: str) -> bool:
    """Pipes to the service (``host:[n]`` under gVisor, which donates only the standard
    streams), bubblewrap's own eventfd, the warm runner's /dev/null stderr, and the probe's
    own listing of its descriptors: nothing else."""
    return (
        target.startswith(("pipe:", "anon_inode:", "host:["))
        or target == "/dev/null"
        or target == f"/proc/{pid}/fd"
    )


async def test_no_process_in_a_run_holds_the_services_environment_or_descriptors(
    sbx: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("GEARSHIFT_CANARY", CANARY)
    fd, listener = _planted_descriptors(tmp_path)
    try:
        for _ in range(2):  # warm: the runner's first call and a later one
            r = await sbx.py(PROBE)
            assert r.exit_status == 0, r.stderr
            assert CANARY not in r.stdout + r.stderr
            seen = json.loads(r.stdout)
            procs = seen["procs"]
            assert procs["1"]["environ"] is not None, "process 1's environment was not checked"
            for pid, proc in procs.items():
                if proc["environ"] is not None:
                    env = dict(v.split("=", 1) for v in proc["environ"].split("\0") if v)
                    assert env.items() <= OWN.items(), (pid, env)
                for num, target in (proc["fds"] or {}).items():
                    assert _expected_target(target, pid), (pid, num, target)
            mine = {int(n) for n, t in procs[seen["me"]]["fds"].items() if "/fd" not in t}
            # a warm call's child also holds the pipe it reports its end on, to the runner
            assert mine == ({0, 1, 2, REPORT_FD} if sbx.kind == "warm" else {0, 1, 2})
    finally:
        os.close(fd)
        listener.close()


async def test_a_shell_and_its_children_see_only_the_runs_variables(
    sbx: Harness, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GEARSHIFT_CANARY", CANARY)
    r = await sbx.sh("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; env")
    assert r.exit_status == 0 and "PATH=/usr/bin:/bin" in r.stdout
    assert CANARY not in r.stdout + r.stderr and "GEARSHIFT" not in r.stdout


async def test_the_warm_runner_and_its_launchers_hold_nothing_of_the_service(
    config: SandboxConfig, monkeypatch: pytest.MonkeyPatch
):
    """Seen from the host, every process of a warm session (the launcher outside the
    namespaces, process 1, and the runner, which tool code cannot read: not dumpable)."""
    monkeypatch.setenv("GEARSHIFT_CANARY", CANARY)
    sandbox = Sandbox(config.model_copy(update={"warm": True}))
    h = Harness(sandbox, "warm")
    try:
        assert (await h.py("print('up')")).stdout == "up\n"
        warm = sandbox.sessions[h.session].warm
        assert warm is not None and warm.cg is not None
        pids = warm.cg.pids()
        assert len(pids) >= 3, pids  # bwrap outside, bwrap as process 1, the runner
        for pid in pids:
            try:
                raw = Path(f"/proc/{pid}/environ").read_bytes().decode("latin-1")
                fd_dir = Path(f"/proc/{pid}/fd")
                fds = {num: os.readlink(fd_dir / num) for num in os.listdir(fd_dir)}
            except (ProcessLookupError, FileNotFoundError):
                continue  # the call's child, killed after it reported and reaped since
            env = dict(v.split("=", 1) for v in raw.split("\0") if v)
            assert env.items() <= OWN.items(), (pid, env)
            for num, target in fds.items():
                assert _expected_target(target, str(pid)), (pid, num, target)
    finally:
        await sandbox.remove(h.session)
