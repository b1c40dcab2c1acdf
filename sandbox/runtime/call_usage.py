"""A warm call's CPU and memory from the kernel: the session's call cgroup.

A warm session's cgroup (``Cgroup(nested=True)``) holds the launch chain — bubblewrap
outside, bubblewrap as the sandbox's process 1, the resident runner — and the child the
runner forked ahead for the next call (``warm_runner``). This module makes, once per
session, a child cgroup ``call`` of it (v1: in the memory and cpuacct hierarchies; v2: one
directory, beside the ``runner`` leaf). After each answer (and at the runner's start) the
service moves the next waiting child into it — the only member of the session's cgroup
outside the chain — in a thread, off the call's path: a move waits for an RCU grace
period in the kernel (0.2 ms quiet, several ms on a loaded host), which must block
neither the event loop nor the call. At the call it zeroes the call cgroup's memory
high-water mark and reads its CPU counter; after the answer it reads both again.
Everything the call's code starts is forked from the child and lands in the call cgroup
too, so a process it forks and never waits for is charged, which the child's own
``getrusage`` report misses. Left out: the child's set-up before its move, and its exit
after its report (which ends after the answer). The session's limits stay where they
are: the call cgroup sets none, the session's apply to its whole subtree.

``memory_peak_mb`` is what the call's processes charged beyond the pages they share with
the runner (on v2, the peak can be reset per call only on a kernel with per-descriptor
``memory.peak``, 6.12 and later; elsewhere memory is the child's own report). A call
whose child was not moved in time (the runner still starting, a move not done after
``WAIT_FOR_MOVE_S``) keeps the child's own report.

Cost on a call's path (v1): one reset, three counter reads and one OOM count, on
descriptors kept open; the move (a look at the session's ``cgroup.procs`` every
millisecond until the child is there, two ``cgroup.procs`` writes) runs between calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path

from sandbox.runtime.base import RuntimeUnavailable
from sandbox.runtime.cgroups import Cgroup

CALL = "call"
CHAIN_LINKS = 3  # outer bubblewrap, bubblewrap as process 1, the runner
FIND_CHILD_S = 30.0  # the runner's start (a fork after an answer takes a millisecond)
LOOK_S = 0.001  # forking the runner takes about that, quiet
WAIT_FOR_MOVE_S = 0.1  # a call waits no longer for its child's move (0.2-20 ms)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _pids(path: Path) -> list[int]:
    # Opened for each read: a v1 cgroup.procs descriptor keeps the list it first read.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return [int(x) for x in os.read(fd, 65536).split()]
    finally:
        os.close(fd)


class CallCgroup:
    """The call cgroup of one warm session; ``prepare`` after an answer (or the runner's
    start), ``admit`` before a call, ``usage`` after it, ``close`` with the session.
    Its counters stay open: a ``pread`` costs a microsecond, a ``read_text`` twenty."""

    def __init__(self, session: Cgroup) -> None:
        self.session = session
        if session.v2:
            if not session.nested:
                raise RuntimeUnavailable("a v2 call cgroup needs a nested session cgroup")
            self.dirs = {"all": session.dirs["all"] / CALL}
        elif {"memory", "cpuacct"} <= set(session.dirs):
            self.dirs = {c: session.dirs[c] / CALL for c in ("memory", "cpuacct")}
        else:
            raise RuntimeUnavailable("cgroup v1 cpuacct is needed for a call's own usage")
        self._fds: list[int] = []
        self._lock = threading.Lock()
        self._closed = False
        try:
            for d in self.dirs.values():
                d.mkdir(exist_ok=True)
            self._joins = [self._open(d / "cgroup.procs", os.O_WRONLY) for d in self.dirs.values()]
            v2 = session.v2
            self._cpu = self._open(self._file("cpuacct", "cpu.stat" if v2 else "cpuacct.usage"))
            # v1 counts an OOM kill in the victim's cgroup only (v2 in its ancestors too)
            self._oom = None if v2 else self._open(self._file("memory", "memory.oom_control"))
        except OSError as exc:
            self.close()
            raise RuntimeUnavailable(f"cannot set up a call cgroup: {exc}") from exc
        self._peak = self._open_peak()
        self.chain: set[int] | None = None
        self.cpu_before: float | None = None
        self.peak_reset = False
        self._moving: asyncio.Task[bool] | None = None  # the next child's move
        self._late: set[asyncio.Task[bool]] = set()  # moves a call did not wait for

    def _open(self, path: Path, flags: int = os.O_RDONLY) -> int:
        fd = os.open(path, flags | os.O_CLOEXEC)
        self._fds.append(fd)
        return fd

    def _open_peak(self) -> int | None:
        """v1: writing 0 resets the high-water mark; v2: a write resets this descriptor's
        (6.12+; before, ``memory.peak`` is read-only and memory stays the child's report)."""
        v2 = self.session.v2
        name = "memory.peak" if v2 else "memory.max_usage_in_bytes"
        try:
            return self._open(self._file("memory", name), os.O_RDWR)
        except OSError:
            return None

    def _file(self, ctl: str, name: str) -> Path:
        return self.dirs["all" if self.session.v2 else ctl] / name

    def _find_chain(self, launcher: int, members: list[int]) -> set[int] | None:
        parents = {p: _ppid(p) for p in members}
        chain = {launcher}
        for _ in range(CHAIN_LINKS - 1):
            chain |= {p for p, parent in parents.items() if parent in chain}
        return chain if len(chain) == CHAIN_LINKS else None

    def _waiting_child(self, launcher: int) -> int | None:
        try:
            members = _pids(self.session.members_file())
        except (OSError, ValueError):
            return None
        if self.chain is None:
            self.chain = self._find_chain(launcher, members)
            if self.chain is None:  # the runner is still starting
                return None
        others = [p for p in members if p not in self.chain]
        return others[0] if len(others) == 1 else None

    def prepare(self, launcher: int) -> None:
        """Start moving the runner's next waiting child (the chain starts at ``launcher``)
        into the call cgroup, in the background."""
        self._cancel()
        self._moving = asyncio.get_running_loop().create_task(self._move(launcher))

    async def _move(self, launcher: int) -> bool:
        # In a thread, which looks every LOOK_S for as long as a call may wait for the move
        # and moves the child it finds: one hand-off per call, no timers on the loop.
        found = await asyncio.to_thread(self._find_and_join, launcher, WAIT_FOR_MOVE_S)
        if found is not None:
            return found
        loop = asyncio.get_running_loop()  # a runner that is starting: look less often
        deadline = loop.time() + FIND_CHILD_S
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            if (child := self._waiting_child(launcher)) is not None:
                return await asyncio.to_thread(self._join, child)
        return False

    def _find_and_join(self, launcher: int, within_s: float) -> bool | None:
        """(In a thread.) Whether the child was moved; None when none turned up in time."""
        deadline = time.monotonic() + within_s
        while not self._closed:
            time.sleep(LOOK_S)  # the runner forks after its answer: not there yet
            if (child := self._waiting_child(launcher)) is not None:
                return self._join(child)
            if time.monotonic() >= deadline:
                return None
        return False

    def _join(self, child: int) -> bool:
        with self._lock:  # never a write to a descriptor ``close`` closed (and reused)
            if self._closed:
                return False
            try:
                for fd in self._joins:
                    os.write(fd, b"%d" % child)
            except OSError:  # it died meanwhile (an OOM kill)
                return False
            return True

    async def admit(self) -> bool:
        """Take the counters' starting points for the call about to be sent, once its
        child is in the call cgroup. False (the call's usage is then the child's own
        report) when the move did not happen or did not end in time."""
        task, self._moving = self._moving, None
        self.cpu_before = None
        if task is None:
            return False
        if not task.done():
            await asyncio.wait({task}, timeout=WAIT_FOR_MOVE_S)
        if not task.done():  # let it end (or fail) on its own; this call is not counted
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return False
        if task.cancelled() or task.exception() is not None or not task.result():
            return False
        self.peak_reset = self._reset_peak()
        self.cpu_before = self._cpu_s()
        return self.cpu_before is not None

    def _reset_peak(self) -> bool:
        if self._peak is None:
            return False
        try:
            os.write(self._peak, b"reset\n" if self.session.v2 else b"0")
        except OSError:
            return False
        return True

    def _cpu_s(self) -> float | None:
        try:
            if not self.session.v2:
                return int(os.pread(self._cpu, 64, 0)) / 1e9
            stat = os.pread(self._cpu, 4096, 0).split()
            return int(stat[stat.index(b"usage_usec") + 1]) / 1e6
        except (OSError, ValueError, IndexError):
            return None

    def _peak_mb(self) -> float | None:
        if self._peak is None:
            return None
        try:
            return int(os.pread(self._peak, 64, 0)) / 2**20
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """OOM kills in the call cgroup that its session's count does not include."""
        if self._oom is None:
            return 0
        try:
            rows = dict(line.split() for line in os.pread(self._oom, 4096, 0).splitlines())
            return int(rows.get(b"oom_kill", 0))
        except (OSError, ValueError):
            return 0

    def usage(self) -> dict[str, float]:
        """The admitted call's CPU seconds and memory high-water mark, as the kernel
        counted them; empty when it was not admitted (``admit`` returned False)."""
        if self.cpu_before is None:
            return {}
        out: dict[str, float] = {}
        if (cpu := self._cpu_s()) is not None:
            out["cpu_s"] = max(0.0, cpu - self.cpu_before)
        if self.peak_reset and (peak := self._peak_mb()) is not None:
            out["memory_peak_mb"] = peak
        self.cpu_before = None
        return out

    def _cancel(self) -> None:
        if self._moving is not None:
            self._moving.cancel()
            self._moving = None

    def close(self) -> None:
        """Stop a move in progress and close the files; the directories go with the
        session's cgroup."""
        self._cancel()
        with self._lock:
            self._closed = True
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
