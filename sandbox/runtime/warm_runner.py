"""The resident interpreter of a warm sandbox. It runs INSIDE the sandbox (bubblewrap,
seccomp, the session's cgroup), started once per session, and forks a child per call:
the interpreter's start-up is paid once, and each call still gets a fresh process. The
child is forked ahead of its call (after the previous call's leftovers were killed) and
waits for its request, so a call does not wait for the fork either, nor for the copies
of the pages the fork left shared: the child rehearses a call while it waits
(``_rehearse``). Nor for the child's exit: tearing down a forked interpreter's address
space takes a millisecond or more, so a child whose code ends normally reports its exit
status and resource usage on fd 4 and closes its streams first; the runner kills it (it
runs no code after that) and answers while the kernel finishes the exit, reaping it
later. The report is the call's own, like its exit status: code that forges it
misreports only itself. A child that dies of a signal (a limit), or execs a command,
reports nothing and is waited for as before.

Protocol on fds 0/1: 4-byte big-endian length + JSON, one request and one reply per call.
A request runs ``code`` in the child, or execs ``argv`` (an absolute path first) there;
``{"ping": true}`` is answered ``{"pong": true}`` without a child. Started with the argument
``announce``, the runner announces each call's child as ``{"forked": pid}`` (its pid here)
right after forking it, at its start and after each reply, so that the service can move it
into the session's call cgroup before sending its request (``call_usage``).
The file is read by the service and passed as ``python3 -I -c SOURCE``: it imports only
the standard library.
"""

import contextlib
import gc
import json
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback
from typing import Any

PR_SET_DUMPABLE = 4
REPORT_FD = 4  # the child's report of how its call ended
REPORT_MAX = 4096


def _no_peeking() -> None:
    """Other processes of the sandbox uid may not open this one's fds through /proc."""
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _read_exact(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


Pending = tuple[int, int, int, int, int, int]


def _prefork(rehearse: bool) -> Pending:
    """Fork the next call's child now, off the call's path: a fresh copy of this runner
    (which never runs tenant code, and whatever the last call left was swept before this),
    waiting for its request; with ``rehearse`` (the last call ran code, not a command) it
    rehearses a call first. Returns (pid, its request pipe, stdin, stdout, stderr and
    report ends)."""
    ctl_r, ctl_w = os.pipe()
    i_r, i_w = os.pipe()
    o_r, o_w = os.pipe()
    e_r, e_w = os.pipe()
    r_r, r_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (ctl_w, i_w, o_r, e_r, r_r):
            os.close(fd)
        _waiting_child(ctl_r, i_r, o_w, e_w, r_w, rehearse)
    for fd in (ctl_r, i_r, o_w, e_w, r_w):
        os.close(fd)
    return pid, ctl_w, i_w, o_r, e_r, r_r


def _waiting_child(ctl_r: int, i_r: int, o_w: int, e_w: int, r_w: int, rehearse: bool) -> None:
    os.setsid()
    os.dup2(i_r, 0)
    os.dup2(o_w, 1)
    os.dup2(e_w, 2)
    os.dup2(ctl_r, 3)
    os.dup2(r_w, REPORT_FD, inheritable=False)  # an exec'd command closes it: waited for
    os.closerange(REPORT_FD + 1, 65536)
    if rehearse and not select.select([3], [], [], 0)[0]:  # not if its call is there (load)
        _rehearse(child=True)
    raw = b""
    while chunk := os.read(3, 65536):
        raw += chunk
    os.close(3)
    if not raw:  # the runner went away before a call came
        os._exit(0)
    _child(json.loads(raw))


def _rehearse(child: bool) -> None:
    """Go through a call's motions on a dummy, while waiting: after a fork, the first
    write to each page this process shares with the other copies it (a fault of a few
    microseconds; a call's compile, JSON and report touch a couple of hundred pages,
    over a millisecond here). Done now, the call finds them copied. The child compiles
    and runs a constant statement in a namespace of its own, which it then drops: no
    output, nothing the call can see. A call that execs a command (``run_shell``) gains
    nothing from it (about a CPU-ms spent in vain): the child after such a call skips it."""
    json.loads(json.dumps({"code": "", "argv": None, "stdin": "", "cpu_s": 1.0}))
    resource.getrusage(resource.RUSAGE_SELF)
    if child:
        exec(compile("_ = 1\n", "<tool>", "exec"), {"__name__": "__main__"})


def _send(body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    _write_all(1, struct.pack(">I", len(data)) + data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _child(req: dict[str, Any]) -> None:
    cpu = max(1, int(req["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU first: says why
    if req.get("argv"):  # a command (run_shell): exec'd in place of this fresh child
        argv = [str(a) for a in req["argv"]]
        try:
            os.execve(argv[0], argv, dict(os.environ))
        except OSError as exc:
            print(f"{argv[0]}: {exc.strerror}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(127)
    status = 0
    try:
        exec(compile(req["code"], "<tool>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        if isinstance(exc.code, int):
            status = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _report(status & 0xFF)
        os._exit(status & 0xFF)


def _report(status: int) -> None:
    """Tell the runner how the call ended and close the call's streams, so that it
    answers without waiting for this process's exit."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    report = {
        "exit_status": status,
        "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "memory_peak_mb": max(me.ru_maxrss, kids.ru_maxrss) / 1024,
    }
    with contextlib.suppress(OSError):
        os.write(REPORT_FD, json.dumps(report).encode())
    for fd in (REPORT_FD, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)


def _reported(raw: bytes) -> tuple[int, dict[str, float]] | None:
    """A child's report: (exit status, usage), or None when it sent none that parses."""
    try:
        report = json.loads(raw)
        usage = {k: float(report[k]) for k in ("cpu_s", "memory_peak_mb")}
        status = report["exit_status"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(status, int) or not 0 <= status <= 255:
        return None
    return status, usage


def _collect(
    pid: int, o_r: int, e_r: int, r_r: int, cap: int, deadline: float
) -> tuple[bytearray, bytearray, bool, str | None, int, dict[str, float]]:
    """Read the child's output until it reported and closed its streams, or exited (then
    kill what it left holding the pipes), or the wall time runs out. Returns (stdout,
    stderr, truncated, limit, exit code (negative: the signal that ended it), usage)."""
    bufs = {o_r: bytearray(), e_r: bytearray(), r_r: bytearray()}
    caps = {o_r: cap, e_r: cap, r_r: REPORT_MAX}
    truncated = False
    limit = None
    status: int | None = None
    usage: Any = None
    open_fds = [o_r, e_r, r_r]
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0 and status is None:
            limit = "wall_time"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            if pid in (reaped := _sweep()):  # the sweep may reap the child itself
                status, usage = reaped[pid]
            deadline = time.monotonic() + 1.0
            continue
        ready, _, _ = select.select(open_fds, [], [], min(max(left, 0.0), 0.05))
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            room = caps[fd] - len(bufs[fd])
            bufs[fd] += chunk[: max(0, room)]
            truncated = truncated or (len(chunk) > room and fd != r_r)
        if status is None and not ready:
            done, st, ru = os.wait4(pid, os.WNOHANG)
            if done:
                status, usage = st, ru
                _sweep()  # a daemon it started would hold the pipes open
    report = _reported(bytes(bufs[r_r])) if status is None else None
    if report is not None:  # killed (and reaped later) by the sweep after this
        return bufs[o_r], bufs[e_r], truncated, limit, report[0], report[1]
    if status is None:
        _, status, usage = os.wait4(pid, 0)
    cpu = {"cpu_s": usage.ru_utime + usage.ru_stime, "memory_peak_mb": usage.ru_maxrss / 1024}
    return bufs[o_r], bufs[e_r], truncated, limit, os.waitstatus_to_exitcode(status), cpu


def _sweep() -> dict[int, tuple[int, Any]]:
    """Kill whatever the call left behind (daemons), and reap it: we are their subreaper.
    Returns the wait status and resource usage of each process reaped."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)
    reaped = {}
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped[pid] = (status, usage)
    return reaped


def _inside_sandbox() -> bool:
    """True only in the sandbox's own pid namespace (bubblewrap is its process 1) and as
    an unprivileged uid: ``_sweep`` kills every process it can see, which on a host would
    be every process there is."""
    with contextlib.suppress(OSError):
        with open("/proc/1/cmdline", "rb") as f:
            init = f.read().split(b"\0")[0]
        return os.getuid() != 0 and os.getpid() != 1 and init.endswith(b"bwrap")
    return False


def serve() -> None:
    if not _inside_sandbox():
        sys.exit("warm_runner: refusing to run outside the sandbox (it kills what it sees)")
    _no_peeking()
    gc.freeze()  # what exists now is never collected: fewer pages copied in each child
    announce = sys.argv[1:] == ["announce"]
    pending = _prefork(rehearse=True)
    if announce:
        _send({"forked": pending[0]})
    while True:
        (size,) = struct.unpack(">I", _read_exact(0, 4))
        req = json.loads(_read_exact(0, size))
        if req.get("ping"):  # the service asks whether the runner is up (a pool's spare)
            _send({"pong": True})
            continue
        started = time.monotonic()
        pid, ctl_w, i_w, o_r, e_r, r_r = pending
        with contextlib.suppress(OSError):  # a child that died (OOM) reports as such below
            call = {k: req.get(k) for k in ("code", "argv", "cpu_s")}
            _write_all(ctl_w, json.dumps(call).encode())
        os.close(ctl_w)
        with contextlib.suppress(OSError):
            os.write(i_w, req["stdin"].encode("latin-1"))
        os.close(i_w)
        out, err, truncated, limit, code, usage = _collect(
            pid, o_r, e_r, r_r, req["output_bytes"], started + req["wall_s"]
        )
        for fd in (o_r, e_r, r_r):
            os.close(fd)
        _sweep()  # the child too, when it reported: it runs nothing after its report
        reply = {
            "exit_status": 128 - code if code < 0 else code,
            "stdout": out.decode("latin-1"),
            "stderr": err.decode("latin-1"),
            "truncated": truncated,
            "limit": limit,
            "duration_ms": (time.monotonic() - started) * 1000,
            "usage": usage,
        }
        _send(reply)
        pending = _prefork(rehearse=not req.get("argv"))  # while the service handles the reply
        if announce:
            _send({"forked": pending[0]})
        _rehearse(child=False)
        with contextlib.suppress(ChildProcessError):  # reaped already, unless it reported
            os.waitpid(pid, 0)  # killed by the sweep: its exit is ending meanwhile


if __name__ == "__main__":
    serve()
