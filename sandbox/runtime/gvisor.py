"""gVisor's ``runsc``: the code runs on a user-space kernel, a stronger boundary than
namespaces alone (a kernel bug reachable from the sandbox is gVisor's, not the host's).

Each run gets an OCI bundle: a read-only root of mount points with ``/usr`` bound
read-only, the workspace read-write at ``/workspace``, a private ``/tmp``, the sandbox
uid, rlimits, memory and pids limits, and no network (``--network=none``). On these
hosts runsc works in ptrace mode (``--platform=ptrace``); its own threads count against
the pids limit, which is therefore at least 1024 (REFERENCES.md). Slower to start than
bubblewrap (about 200 ms): choose it with ``sandbox.runtime: gvisor`` where the
stronger boundary is worth it.
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
from sandbox.runtime.base import ProcessResult, RuntimeUnavailable, Streams

STATE = Path("/run/gearshift-runsc")


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
                "env": ["PATH=/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8"],
                "cwd": "/workspace", "noNewPrivileges": True, "rlimits": rlimits,
            },
            "root": {"path": str(self._rootfs()), "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
                "resources": {"pids": {"limit": max(1024, limits.pids)},
                              "memory": {"limit": limits.memory_mb << 20}},
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
            "--root",
            str(STATE / "state"),
        ]
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *base, "run", "--bundle", str(bundle), cid,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
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
                *base, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            await p.wait()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
