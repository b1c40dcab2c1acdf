"""A warm call's CPU and memory from the kernel: the session's call cgroup.

A warm session's cgroup (``Cgroup(nested=True)``) holds the launch chain — bubblewrap
outside, bubblewrap as the sandbox's process 1, the resident runner — and the child the
runner forked ahead for the next call (``warm_runner``). This module makes, once per
session, a child cgroup ``call`` of it (v1: in the memory and cpuacct hierarchies; v2: one
directory, beside the ``runner`` leaf). The runner announces each child it forks (a
frame with the child's pid, right after the fork: at its start and after each answer), and
the service moves that child into the call cgroup — it is the only member of the session's
cgroup outside the chain, or the one with that pid in the sandbox while the previous
call's child is still exiting — in a thread, off the call's path and without polling: a
move waits for an RCU grace period in the kernel (0.2 ms quiet, several ms on a loaded
host), which must block neither the event loop nor the call. The child cannot run the call
before the move: it waits for its request, which the service sends after it. At the call
the service zeroes the call cgroup's memory
high-water mark and reads its CPU counter; after the answer it reads both again.
Everything the call's code starts is forked from the child and lands in the call cgroup
too, so a process it forks and never waits for is charged, which the child's own
``getrusage`` report misses. Left out: the child's set-up before its move, and its exit
after its report (which ends after the answer). The session's limits stay where they
are: the call cgroup sets none, the session's apply to its whole subtree.

``memory_peak_mb`` is what the call's processes charged beyond the pages they share with
the runner (on v2, the peak can be reset per call only on a kernel with per-descriptor
``memory.peak``, 6.12 and later; elsewhere memory is the child's own report). A call
whose child was not moved in time (a move not done ``WAIT_FOR_MOVE_S`` after the call
came) keeps the child's own report.

Cost on a call's path (v1): one reset, three counter reads and one OOM count, on
descriptors kept open; the move (one read of the session's ``cgroup.procs``, two
``cgroup.procs`` writes, one hand-off to a thread) runs between calls.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sandbox.runtime.base import RuntimeUnavailable
from sandbox.runtime.cgroups import Cgroup

CALL = "call"
CHAIN_LINKS = 3  # outer bubblewrap, bubblewrap as process 1, the runner
WAIT_FOR_MOVE_S = 0.1  # a call waits no longer for its child's move (0.2-20 ms)
MOVERS = 4  # threads making moves, for all sessions: each mostly waits in the kernel


@functools.cache
def _movers() -> ThreadPoolExecutor:
    """The threads that move children (made on first use, one set per process)."""
    return ThreadPoolExecutor(MOVERS, thread_name_prefix="gearshift-call-cgroup")


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _innermost_pid(pid: int) -> int | None:
    """``pid``'s pid in its own (the sandbox's) pid namespace."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _pids(path: Path) -> list[int]:
    # Opened for each read: a v1 cgroup.procs descriptor keeps the list it first read.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return [int(x) for x in os.read(fd, 65536).split()]
    finally:
        os.close(fd)


class CallCgroup:
    """The call cgroup of one warm session; ``move`` each child the runner announces (in a
    thread), ``begin`` before its call, ``usage`` after it, ``close`` with the session.
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
        self.moved: int | None = None  # the last child moved in (host pid)
        self.cpu_before: float | None = None
        self.peak_reset = False

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

    def _host_pid(self, launcher: int, child: int) -> int | None:
        """The host pid of the runner's child ``child`` (its pid in the sandbox): the one
        member of the session's cgroup outside the chain but the previous child moved (it
        may still be exiting), or, among several, the one whose innermost pid is ``child``.
        Only a member of this session's cgroup is ever returned, whatever ``child`` says."""
        try:
            members = _pids(self.session.members_file())
        except (OSError, ValueError):
            return None
        if self.chain is None:
            self.chain = self._find_chain(launcher, members)
            if self.chain is None:
                return None
        others = [p for p in members if p not in self.chain and p != self.moved]
        if len(others) > 1:
            others = [p for p in others if _innermost_pid(p) == child]
        return others[0] if len(others) == 1 else None

    def move_soon(self, launcher: int, child: int) -> Future[bool]:
        """``move`` in a mover thread; its outcome, when it has one."""
        return _movers().submit(self.move, launcher, child)

    def move(self, launcher: int, child: int) -> bool:
        """(In a thread: a ``cgroup.procs`` write waits for an RCU grace period.) Move the
        runner's child that it announced as ``child`` (the chain starts at ``launcher``)
        into the call cgroup; whether it was moved."""
        host_pid = self._host_pid(launcher, child)
        if host_pid is None:
            return False
        with self._lock:  # never a write to a descriptor ``close`` closed (and reused)
            if self._closed:
                return False
            try:
                for fd in self._joins:
                    os.write(fd, b"%d" % host_pid)
            except OSError:  # it died meanwhile (an OOM kill)
                return False
            self.moved = host_pid
            return True

    def begin(self) -> bool:
        """Take the counters' starting points for the call about to be sent, whose child
        was moved into the call cgroup. False when they cannot be read (the call's usage
        is then the child's own report)."""
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

    def close(self) -> None:
        """Close the files (a move in progress then moves nothing); the directories go
        with the session's cgroup."""
        with self._lock:
            self._closed = True
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
