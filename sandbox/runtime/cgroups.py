"""One cgroup per sandboxed run: memory, pids and CPU limits, usage, and a whole-tree kill.

These hosts mount cgroup v1 controllers (``/sys/fs/cgroup/{memory,pids,cpu,cpuacct}``); a v2
host (``/sys/fs/cgroup/cgroup.controllers``) gets one directory with ``memory.max``,
``pids.max``, ``cpu.max`` and ``cgroup.kill``. Everything a run starts stays in its cgroup,
so killing the cgroup's processes takes the whole tree, daemons included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from sandbox.policy import ResourceClass
from sandbox.runtime.base import RuntimeUnavailable

ROOT = Path("/sys/fs/cgroup")
V1 = ("memory", "pids", "cpu", "cpuacct")


STALE_AFTER_S = 60.0


def remove_stale(root: Path = ROOT, older_than_s: float = STALE_AFTER_S) -> int:
    """Remove the empty run cgroups a crashed service left behind. Never one with
    processes in it, nor one made in the last ``older_than_s``: another sandbox service
    on the host creates a run's cgroup empty and moves the run into it a moment later."""
    removed = 0
    cutoff = time.time() - older_than_s
    for parent in [root / "gearshift", *(root / c / "gearshift" for c in V1)]:
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            with contextlib.suppress(OSError):
                if not d.is_dir() or d.stat().st_mtime > cutoff:
                    continue
                if not (d / "cgroup.procs").read_text().strip():
                    for child in [c for c in d.iterdir() if c.is_dir()]:
                        child.rmdir()  # a warm session's call cgroup; EBUSY while in use
                    d.rmdir()
                    removed += 1
    return removed


RUNNER_LEAF = "runner"  # v2, ``nested``: where the processes go, beside child cgroups


class Cgroup:
    """``nested``: child cgroups with controllers will be made in this one (a warm session's
    call cgroup, ``call_usage``). v1 allows processes beside them; v2 does not (no internal
    processes), so there the processes join a leaf, ``runner``, and the controllers are
    enabled for the children. Limits stay on this cgroup, over the whole subtree."""

    def __init__(
        self, name: str, limits: ResourceClass, root: Path = ROOT, nested: bool = False
    ) -> None:
        self.v2 = (root / "cgroup.controllers").exists()
        self.nested = nested
        self._oom_fd: int | None = None  # kept open: a warm session reads it every call
        if self.v2:
            self.dirs = {"all": root / "gearshift" / name}
        else:
            self.dirs = {c: root / c / "gearshift" / name for c in V1 if (root / c).is_dir()}
            if not {"memory", "pids", "cpu"} <= set(self.dirs):
                raise RuntimeUnavailable("cgroup v1 memory, pids and cpu controllers are needed")
        try:
            for d in self.dirs.values():
                d.mkdir(parents=True, exist_ok=True)
            self._limit(limits)
            if self.v2 and nested:
                self._write("all", "cgroup.subtree_control", "+memory +pids +cpu")
                (self.dirs["all"] / RUNNER_LEAF).mkdir(exist_ok=True)
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot create a cgroup under {root}: {exc}") from exc

    def _write(self, ctl: str, name: str, value: str) -> None:
        (self.dirs["all" if self.v2 else ctl] / name).write_text(value)

    def _limit(self, limits: ResourceClass) -> None:
        mem = str(limits.memory_mb << 20)
        quota = 100_000  # one CPU's worth per period: CPU time is bounded by cpu_s
        if self.v2:
            self._write("memory", "memory.max", mem)
            self._write("memory", "memory.swap.max", "0")
            self._write("pids", "pids.max", str(limits.pids))
            self._write("cpu", "cpu.max", f"{quota} 100000")
        else:
            self._write("memory", "memory.limit_in_bytes", mem)
            with contextlib.suppress(OSError):  # absent without swap accounting
                self._write("memory", "memory.memsw.limit_in_bytes", mem)
            self._write("pids", "pids.max", str(limits.pids))
            self._write("cpu", "cpu.cfs_period_us", "100000")
            self._write("cpu", "cpu.cfs_quota_us", str(quota))

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process must write its pid into to join."""
        if self.v2 and self.nested:
            return [str(self.dirs["all"] / RUNNER_LEAF / "cgroup.procs")]
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def members_file(self) -> Path:
        """The ``cgroup.procs`` listing the processes of the cgroup they joined
        (``procs_files``), not those of its children."""
        if self.v2:
            d = self.dirs["all"] / RUNNER_LEAF if self.nested else self.dirs["all"]
        else:
            d = self.dirs.get("cpuacct", self.dirs["pids"])
        return d / "cgroup.procs"

    def pids(self) -> list[int]:
        """Every process in the cgroup, its children's included (v1's pids hierarchy has
        no children: only memory and cpuacct get a call cgroup)."""
        d = self.dirs["all" if self.v2 else "pids"]
        out: list[int] = []
        for procs in [d / "cgroup.procs", *d.glob("*/cgroup.procs")]:
            with contextlib.suppress(OSError, ValueError):
                out += [int(p) for p in procs.read_text().split()]
        return out

    def kill(self, spare: int | None = None, timeout_s: float = 2.0) -> None:
        """SIGKILL every process in the cgroup (but ``spare``) until none is left.

        Sparing the launcher lets it reap what it started: killing it first would
        orphan its children to a host init that may never reap them.
        """
        if spare is None and self.v2 and (self.dirs["all"] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.dirs["all"] / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + timeout_s
        while (pids := [p for p in self.pids() if p != spare]) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def usage(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with contextlib.suppress(OSError, ValueError):
            if self.v2:
                stat = dict(
                    line.split()
                    for line in (self.dirs["all"] / "cpu.stat").read_text().splitlines()
                )
                out["cpu_s"] = int(stat["usage_usec"]) / 1e6
                out["memory_peak_mb"] = int((self.dirs["all"] / "memory.peak").read_text()) / 2**20
            else:
                out["cpu_s"] = int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
                peak = int((self.dirs["memory"] / "memory.max_usage_in_bytes").read_text())
                out["memory_peak_mb"] = peak / 2**20
        return out

    def oom_kills(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            if self._oom_fd is None:
                name = "memory.events" if self.v2 else "memory.oom_control"
                path = self.dirs["all" if self.v2 else "memory"] / name
                self._oom_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            rows = dict(line.split() for line in os.pread(self._oom_fd, 4096, 0).splitlines())
            return int(rows.get(b"oom_kill", 0))
        return 0

    def hit(self) -> str | None:
        """Which cgroup limit fired, if one did."""
        with contextlib.suppress(OSError, ValueError):
            if self.v2:
                events = dict(
                    line.split()
                    for line in (self.dirs["all"] / "memory.events").read_text().splitlines()
                )
                if int(events.get("oom_kill", 0)):
                    return "memory"
                pev = dict(
                    line.split()
                    for line in (self.dirs["all"] / "pids.events").read_text().splitlines()
                )
                if int(pev.get("max", 0)):
                    return "pids"
            else:
                oom = dict(
                    line.split()
                    for line in (self.dirs["memory"] / "memory.oom_control")
                    .read_text()
                    .splitlines()
                )
                if int(oom.get("oom_kill", 0)):
                    return "memory"
                if int((self.dirs["pids"] / "pids.events").read_text().split()[1]):
                    return "pids"
        return None

    def remove(self) -> None:
        self.kill()
        if self._oom_fd is not None:
            os.close(self._oom_fd)
            self._oom_fd = None
        for d in self.dirs.values():
            with contextlib.suppress(OSError):
                for child in [c for c in d.iterdir() if c.is_dir()]:
                    child.rmdir()
                d.rmdir()
