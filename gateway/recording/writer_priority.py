"""The writer process's scheduling: idle priority while it is served, a rescue when it is not.

The writer's batches cost milliseconds of CPU (20 ms for 80 chat steps, ~70 ms for 100
agent steps). Where it shares a core with the gateway, niceness alone does not keep them
off the request path: once the writer has the core, the scheduler lets it finish its
slice, and a request that wakes meanwhile waits until the next tick (4 ms at HZ=250).
Under ``SCHED_IDLE`` the writer runs only when no other task wants the core, and a
request that wakes takes the core at once (docs/decisions/writer-idle-priority.md).

The price: a task at idle priority gets almost nothing (a weight of 3 against 1,024 per
normal task) while something else keeps the core busy, the gateway itself included when
it is saturated. So the recorder, which puts the writer at idle priority, also watches it
(``StarvationWatch``, from ``/proc/PID/schedstat`` and ``stat``): a writer at idle
priority that wants the CPU and barely gets it for ``STARVED_S`` is brought back to its
niceness, and goes back to idle priority after a cool-down (``IdleSchedule``). Bringing a
process back from idle priority takes ``CAP_SYS_NICE`` (root has it; a container does not
unless granted) or a matching ``RLIMIT_NICE``: where the gateway has neither, or the
kernel does not say how much a process ran, the writer stays at its niceness, as before.
Should bringing it back fail all the same, the writer is killed and started again (the
unacknowledged batch is sent again, as after any writer death).
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

WATCH_S = 0.25  # how often the recorder looks at the writer
STARVED_S = 0.5  # this long wanting the CPU and barely getting it: a starved writer
RAN = 0.05  # a starved window: runnable, and ran at most this share of it
COOLDOWN_S = 5.0  # back at idle priority this long after a rescue ...
CALM_S = 5.0  # ... doubled for a writer starved again this soon after going back (the
# core still busy: a starved writer is seen ~0.75 s after it went back)
MAX_COOLDOWN_S = 600.0
CAP_SYS_NICE = 23


def cpu_state(pid: int) -> tuple[int, bool] | None:
    """Nanoseconds ``pid``'s main thread has run, and whether it wants the CPU now
    (running or waiting for a core: state R); None where the kernel does not say (no
    ``CONFIG_SCHED_INFO``, not Linux, the process gone). The kernel adds a task's wait
    for a core to its schedstat only once it runs, so a starved task shows as one that
    is runnable and does not run."""
    try:
        ran = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return ran, state == "R"


def can_go_idle() -> bool:
    """Whether a writer here may run at idle priority: the policy exists and the
    recorder can see how much a process ran and whether it is runnable (this one's, as a
    sample)."""
    return hasattr(os, "SCHED_IDLE") and cpu_state(os.getpid()) is not None


def may_raise(nice: int) -> bool:
    """Whether this process may bring a process of its own back from idle priority to
    ``nice``: with ``CAP_SYS_NICE`` (root, or granted), or an ``RLIMIT_NICE`` that allows
    that niceness (the kernel treats idle priority as below every niceness)."""
    if _has_cap_sys_nice():
        return True
    try:
        limit = resource.getrlimit(resource.RLIMIT_NICE)[0]
    except (OSError, ValueError, AttributeError):
        return False
    return limit == resource.RLIM_INFINITY or limit >= 20 - nice


def _has_cap_sys_nice() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _set_policy(pid: int, policy: str) -> bool:
    try:
        os.sched_setscheduler(pid, getattr(os, policy), os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def set_idle(pid: int) -> bool:
    """Put ``pid``'s main thread at ``SCHED_IDLE`` (anyone may lower a process of their
    own so); False where that cannot be done."""
    return _set_policy(pid, "SCHED_IDLE")


def set_normal(pid: int) -> bool:
    """Bring ``pid``'s main thread back to ``SCHED_OTHER`` at its niceness: only with
    ``CAP_SYS_NICE`` (or an ``RLIMIT_NICE`` that allows it); False otherwise."""
    return _set_policy(pid, "SCHED_OTHER")


def is_idle(pid: int) -> bool:
    try:
        return os.sched_getscheduler(pid) == os.SCHED_IDLE
    except (AttributeError, OSError):
        return False


class StarvationWatch:
    """Says when a writer at idle priority has been starved for ``STARVED_S``: runnable
    at every look and running at most ``RAN`` of the time between them."""

    def __init__(self, starved_s: float = STARVED_S) -> None:
        self.starved_s = starved_s
        self._pid: int | None = None
        self._last: tuple[float, int] | None = None
        self._since: float | None = None  # start of the current run of starved windows

    def starved(self, pid: int, now: float | None = None) -> bool:
        """Look at ``pid`` once (call every ``WATCH_S``); True once it has been starved
        for ``starved_s`` in a row while at idle priority."""
        now = time.monotonic() if now is None else now
        state = cpu_state(pid)
        last = self._last if pid == self._pid else None
        self._pid, self._last = pid, None if state is None else (now, state[0])
        if state is None or last is None or now <= last[0]:
            self._since = None
            return False
        ran = (state[0] - last[1]) / ((now - last[0]) * 1e9)
        if not state[1] or ran > RAN or not is_idle(pid):
            self._since = None
            return False
        if self._since is None:
            self._since = last[0]
        return now - self._since >= self.starved_s


class IdleSchedule:
    """When the writer should be at idle priority: from the start, and again a cool-down
    after each rescue (``COOLDOWN_S``; doubled, up to ``MAX_COOLDOWN_S``, for a writer that
    starves again within ``CALM_S`` of going back: the core stays busy)."""

    def __init__(self, enabled: bool, nice: int) -> None:
        self.enabled = enabled and can_go_idle() and may_raise(nice)
        self._idle_at = 0.0  # monotonic time from which the writer may be idle again
        self._cooldown = COOLDOWN_S

    def due(self, now: float | None = None) -> bool:
        """Whether the writer should be at idle priority now."""
        now = time.monotonic() if now is None else now
        return self.enabled and now >= self._idle_at

    def rescued(self, now: float | None = None) -> float:
        """A starved writer is brought back: the cool-down it gets, in seconds."""
        now = time.monotonic() if now is None else now
        again = now - self._idle_at < CALM_S
        self._cooldown = min(self._cooldown * 2, MAX_COOLDOWN_S) if again else COOLDOWN_S
        self._idle_at = now + self._cooldown
        return self._cooldown
