"""A warm call's usage comes from the kernel: the session's call cgroup (``call_usage``)."""

from __future__ import annotations

from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.core import Sandbox
from sandbox.policy import ResourceClass
from sandbox.runtime.call_usage import CALL, CallCgroup
from sandbox.runtime.cgroups import RUNNER_LEAF, Cgroup
from tests.sandbox.conftest import Harness

# The call forks a process that burns CPU and is never waited for (the parent learns it is
# done through a pipe): the child's own getrusage report cannot see it, the kernel can.
FORK_AND_BURN = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    os.write(w, b"x")
    os._exit(0)
os.read(r, 1)
print("done")
"""


async def test_cpu_of_a_forked_process_the_call_never_waited_for_is_charged(
    config: SandboxConfig,
):
    sandbox = Sandbox(config.model_copy(update={"warm": True, "pool": 0, "kernel_usage": True}))
    h = Harness(sandbox, "warm")
    try:
        first = await h.py("print(1)")  # the runner starts, and announces its first child
        assert "reported_cpu_s" in first.usage, first.usage  # counted: moved before the call
        r = await h.py(FORK_AND_BURN)
        assert (r.exit_status, r.stdout) == (0, "done\n"), r
        assert r.usage["cpu_s"] >= 0.28, r.usage  # the kernel's: the grandchild included
        assert r.usage["reported_cpu_s"] < 0.1, r.usage  # the child's own: missed it
        big = await h.py("x = bytearray(40 << 20); print(len(x))")
        small = await h.py("print(1)")
        assert big.usage["memory_peak_mb"] >= 40, big.usage
        assert small.usage["memory_peak_mb"] < 10, small.usage  # the peak is per call
        warm = sandbox.sessions[h.session].warm
        assert warm is not None and warm.calls is not None and warm.cg is not None
        call_dirs = list(warm.calls.dirs.values())
        assert all(d.is_dir() for d in call_dirs)
    finally:
        await sandbox.close()
    assert not any(d.exists() for d in call_dirs)  # removed with the session's cgroup


def test_on_cgroup_v2_the_runner_joins_a_leaf_beside_the_call_cgroup(tmp_path: Path):
    """No internal processes on v2: a nested session cgroup puts its processes in a leaf
    and enables its controllers for the children (a directory tree stands in for the
    cgroup filesystem; the kernel-backed path runs above, on this host's hierarchy)."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    cg = Cgroup("s", ResourceClass(), root=tmp_path, nested=True)
    session = tmp_path / "gearshift" / "s"
    assert cg.procs_files() == [str(session / RUNNER_LEAF / "cgroup.procs")]
    assert (session / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    (session / RUNNER_LEAF / "cgroup.procs").write_text("11\n12\n")
    (session / CALL).mkdir()  # the kernel makes a cgroup's files with it
    for name, text in (("cgroup.procs", "13\n"), ("cpu.stat", "usage_usec 2500\n")):
        (session / CALL / name).write_text(text)
    calls = CallCgroup(cg)
    try:
        assert calls.dirs == {"all": session / CALL}
        assert cg.members_file() == session / RUNNER_LEAF / "cgroup.procs"
        assert sorted(cg.pids()) == [11, 12, 13]  # the whole subtree, for the kill
        assert calls._cpu_s() == 0.0025  # cpu.stat's usage_usec
        assert calls._peak is None  # no memory.peak to reset: memory is the child's report
    finally:
        calls.close()
