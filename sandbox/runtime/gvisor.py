"""gVisor's ``runsc``: the code runs on a user-space kernel, a stronger boundary than
namespaces alone (a kernel bug reachable from the sandbox is gVisor's, not the host's).

Each run gets an OCI bundle: a read-only root of mount points with ``/usr`` bound
read-only, the workspace read-write at ``/workspace``, a private ``/tmp``, the sandbox
uid, and no network (``--network=none``). On these hosts runsc works in ptrace mode
(``--platform=ptrace``).

Where the grant's limits are enforced, and how this differs from bubblewrap:

- processes and threads: ``RLIMIT_NPROC`` = the grant's ``pids``, enforced by gVisor's
  kernel, whose only tasks are the run's (it counts threads, as Linux does). The host
  cgroup's pids limit (``linux.resources.pids``) also holds gVisor's own threads, so it
  stays at least 1024 (REFERENCES.md): there it only bounds gVisor itself.
- memory: the host cgroup's limit, which counts gVisor's own memory as well: a run gets
  somewhat less than under bubblewrap, and runsc does not say which limit killed it.
- CPU seconds, file size, open files, core dumps: rlimits, enforced by gVisor's kernel.
- system calls: the project's seccomp profile (``sandbox.runtime.seccomp.oci``) as the
  spec's ``linux.seccomp``, which ``--oci-seccomp`` makes gVisor enforce on the run's
  calls to its kernel (gVisor also filters its own calls to the host).
- environment: runsc starts like bubblewrap's chain (``base.launch``): the run's own
  variables (``RUN_ENV``) and no descriptor of the service's; the run's process gets
  ``process.env``, the same variables.

Slower to start than bubblewrap (about 200 ms): choose it with ``sandbox.runtime: gvisor``
where the stronger boundary is worth it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sandbox.policy import ResourceClass
from sandbox.runtime import seccomp
from sandbox.runtime.base import RUN_ENV, ProcessResult, RuntimeUnavailable, Streams, launch

STATE = Path("/run/gearshift-runsc")
HOST_PIDS_FLOOR = 1024  # runsc's own threads share the host cgroup's pids limit


class RunscRuntime:
    name = "gvisor"

    def __init__(self, uid: int = 65534, gid: int = 65534, platform: str = "ptrace") -> None:
        self.uid, self.gid, self.platform = uid, gid, platform
        self._runsc = shutil.which("runsc")

    def check(self) -> None:
        if self._runsc is None:
            raise RuntimeUnavailable("gVisor (runsc) is not installed: apt-get install runsc")
        if os.geteuid() != 0:
            raise RuntimeUnavailable("runsc needs root to create its sandboxes")

    def _rootfs(self) -> Path:
        root = STATE / "rootfs"
        if not (root / "workspace").is_dir():
            for d in ("usr", "workspace", "tmp", "proc", "dev"):
                (root / d).mkdir(parents=True, exist_ok=True)
            for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
                with contextlib.suppress(FileExistsError):
                    (root / link).symlink_to(target)
        return root

    def spec(self, argv: list[str], workspace: Path, limits: ResourceClass) -> dict[str, Any]:
        cpu = max(1, int(limits.cpu_s))
        rlimits = [
            {"type": "RLIMIT_CPU", "soft": cpu, "hard": cpu + 1},
            {"type": "RLIMIT_FSIZE", "soft": limits.file_mb << 20, "hard": limits.file_mb << 20},
            {"type": "RLIMIT_NOFILE", "soft": 256, "hard": 256},
            {"type": "RLIMIT_CORE", "soft": 0, "hard": 0},
            {"type": "RLIMIT_NPROC", "soft": limits.pids, "hard": limits.pids},
        ]
        mounts = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]},
            {"destination": "/workspace", "type": "bind", "source": str(workspace), "options": ["rbind", "rw"]},
        ]  # fmt: skip
        return {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False, "user": {"uid": self.uid, "gid": self.gid}, "args": argv,
                "env": [f"{k}={v}" for k, v in RUN_ENV.items()],
                "cwd": "/workspace", "noNewPrivileges": True, "rlimits": rlimits,
            },
            "root": {"path": str(self._rootfs()), "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
                "resources": {"pids": {"limit": max(HOST_PIDS_FLOOR, limits.pids)},
                              "memory": {"limit": limits.memory_mb << 20}},
                "seccomp": seccomp.oci(),
            },
        }  # fmt: skip

    async def run(
        self, argv: list[str], workspace: Path, limits: ResourceClass, stdin: bytes = b""
    ) -> ProcessResult:
        self.check()
        assert self._runsc is not None
        cid = "gs-" + uuid.uuid4().hex[:16]
        STATE.mkdir(mode=0o700, parents=True, exist_ok=True)
        bundle = Path(tempfile.mkdtemp(prefix="bundle-", dir=STATE))
        (bundle / "config.json").write_text(json.dumps(self.spec(argv, workspace, limits)))
        base = [
            self._runsc,
            f"--platform={self.platform}",
            "--network=none",
            "--oci-seccomp",
            "--root",
            str(STATE / "state"),
        ]
        started = time.perf_counter()
        proc = await launch([*base, "run", "--bundle", str(bundle), cid])
        io = Streams(proc, limits.output_bytes)
        try:
            limit = None if await io.run(stdin, limits.wall_s) else "wall_time"
        finally:
            await self._destroy(base, cid, proc)
            await io.close()
            shutil.rmtree(bundle, ignore_errors=True)
        out, err = io.out, io.err
        status = proc.returncode if proc.returncode is not None else 137
        truncated = out.truncated or err.truncated
        if limit is None and status == 128 + 24:
            limit = "cpu"
        elif limit is None and status == 128 + 25:
            limit = "file_size"
        elif limit is None and truncated:
            limit = "output"
        return ProcessResult(
            exit_status=status, stdout=out.value(), stderr=err.value(),
            duration_ms=(time.perf_counter() - started) * 1000, limit=limit, truncated=truncated,
        )  # fmt: skip

    async def _destroy(self, base: list[str], cid: str, proc: asyncio.subprocess.Process) -> None:
        """Kill every process of the container and remove it, whatever state it is in."""
        for args in (["kill", "--all", cid, "KILL"], ["delete", "--force", cid]):
            p = await asyncio.create_subprocess_exec(
                *base, *args, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, env=dict(RUN_ENV), cwd="/",
            )  # fmt: skip
            await p.wait()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
