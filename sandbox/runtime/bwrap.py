"""bubblewrap + seccomp + a cgroup + rlimits, launched as an unprivileged host user.

The launch chain, each link exec'ing the next so that nothing lingers::

    sh (root)        joins the run's cgroup: every descendant stays in it
    prlimit          core 0, file size, open files, CPU seconds
    setpriv          drops to the sandbox uid/gid, no groups, no capabilities, no_new_privs
    bwrap            new user/pid/net/ipc/uts/cgroup namespaces, no nested user namespaces,
                     read-only /usr, the workspace read-write at /workspace, empty /tmp,
                     no network at all, seccomp filter, dies with its parent
    the tool         python3 -c ..., sh -c ...

bwrap runs as a non-root uid because, as root, its sandbox would map to host root. On a
timeout the whole cgroup is killed, so a daemon that double-forked is gone too.

The chain starts from ``base.launch``: its environment is the run's own (``RUN_ENV``),
nothing of the service's, because bwrap's process 1 inside the sandbox keeps what it was
started with; each link is named by absolute path, and the only descriptors it inherits
are its pipes and the seccomp program (which bwrap closes once loaded).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path

from sandbox.policy import ResourceClass
from sandbox.runtime import seccomp
from sandbox.runtime.base import RUN_ENV, ProcessResult, RuntimeUnavailable, Streams, launch
from sandbox.runtime.cgroups import Cgroup

SANDBOX_UID = 65534  # nobody
# The shell exports PWD (the service's directory) on start; unset, process 1's environment
# is exactly the run's.
JOIN = 'for p in "$@"; do [ "$p" = -- ] && break; echo $$ > "$p" || exit 125; shift; done; shift; unset PWD; exec "$@"'


class BwrapRuntime:
    name = "bwrap"

    def __init__(self, uid: int = SANDBOX_UID, gid: int = SANDBOX_UID) -> None:
        self.uid, self.gid = uid, gid
        self._bwrap = shutil.which("bwrap")
        # Resolved once, here: the launch chain's own PATH is the run's, not the service's.
        self._prlimit, self._setpriv = shutil.which("prlimit"), shutil.which("setpriv")

    def check(self) -> None:
        if self._bwrap is None:
            raise RuntimeUnavailable(
                "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
            )
        if os.geteuid() != 0:
            raise RuntimeUnavailable("the sandbox service must start as root to set up cgroups")
        for tool, path in (("prlimit", self._prlimit), ("setpriv", self._setpriv)):
            if path is None:
                raise RuntimeUnavailable(f"{tool} (util-linux) is not installed")

    def command(
        self, argv: list[str], workspace: Path, limits: ResourceClass, cg: Cgroup, bpf_fd: int
    ) -> list[str]:
        assert self._bwrap and self._prlimit and self._setpriv
        return [
            "/bin/sh", "-c", JOIN, "sh", *cg.procs_files(), "--",
            self._prlimit, "--core=0", f"--fsize={limits.file_mb << 20}", "--nofile=256",
            f"--cpu={max(1, int(limits.cpu_s))}:{max(1, int(limits.cpu_s)) + 1}", "--",
            self._setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            self._bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(workspace), "/workspace", "--chdir", "/workspace",
            "--clearenv", *(a for k, v in RUN_ENV.items() for a in ("--setenv", k, v)),
            "--hostname", "sandbox", "--seccomp", str(bpf_fd), "--",
            *argv,
        ]  # fmt: skip

    async def run(
        self, argv: list[str], workspace: Path, limits: ResourceClass, stdin: bytes = b""
    ) -> ProcessResult:
        self.check()
        cg = Cgroup(uuid.uuid4().hex[:16], limits)
        bpf = seccomp.filter_file()
        started = time.perf_counter()
        try:
            proc = await launch(
                self.command(argv, workspace, limits, cg, bpf.fileno()), pass_fds=[bpf.fileno()]
            )
            return await self._collect(proc, cg, limits, stdin, started)
        finally:
            bpf.close()
            await asyncio.to_thread(cg.remove)

    async def _collect(
        self,
        proc: asyncio.subprocess.Process,
        cg: Cgroup,
        limits: ResourceClass,
        stdin: bytes,
        started: float,
    ) -> ProcessResult:
        io = Streams(proc, limits.output_bytes)
        limit = None if await io.run(stdin, limits.wall_s) else "wall_time"
        # Everything inside goes (daemons included); the launcher (bwrap) then reaps its
        # children and exits by itself, so nothing is orphaned to the host's init.
        await asyncio.to_thread(cg.kill, proc.pid)
        await io.close()
        try:
            status = await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            status = await proc.wait()
        out, err = io.out, io.err
        usage = cg.usage()
        if limit is None:
            limit = cg.hit() or _signal_limit(status, usage, limits, out.truncated or err.truncated)
        return ProcessResult(
            exit_status=status, stdout=out.value(), stderr=err.value(),
            duration_ms=(time.perf_counter() - started) * 1000, limit=limit,
            truncated=out.truncated or err.truncated, usage=usage,
        )  # fmt: skip


def _signal_limit(
    status: int, usage: dict[str, float], limits: ResourceClass, truncated: bool
) -> str | None:
    """bwrap reports a signal death as 128 + the signal number."""
    if status in (128 + 24, -24):  # SIGXCPU: RLIMIT_CPU's soft limit
        return "cpu"  # the signal says so; the cgroup's CPU figure can read below the limit
    killed = status > 128 or status < 0
    if killed and usage.get("cpu_s", 0.0) >= 0.95 * max(1, int(limits.cpu_s)):
        return "cpu"  # SIGKILL at RLIMIT_CPU's hard limit
    if status in (128 + 25, -25):  # SIGXFSZ
        return "file_size"
    return "output" if truncated else None
