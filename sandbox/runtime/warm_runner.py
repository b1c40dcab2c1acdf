"""The resident interpreter of a warm sandbox. It runs INSIDE the sandbox (bubblewrap,
seccomp, the session's cgroup), started once per session, and forks a child per call:
the interpreter's start-up is paid once, and each call still gets a fresh process.

Protocol on fds 0/1: 4-byte big-endian length + JSON, one request and one reply per call.
The file is read by the service and passed as ``python3 -I -c SOURCE``: it imports only
the standard library.
"""

import contextlib
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


def _child(req: dict[str, Any], i_r: int, o_w: int, e_w: int) -> None:
    os.setsid()
    os.dup2(i_r, 0)
    os.dup2(o_w, 1)
    os.dup2(e_w, 2)
    os.closerange(3, 65536)
    cpu = max(1, int(req["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU first: says why
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
        os._exit(status & 0xFF)


def _collect(
    pid: int, o_r: int, e_r: int, cap: int, deadline: float
) -> tuple[bytearray, bytearray, bool, str | None, int, Any]:
    """Read the child's output until it exits (then kill what it left holding the pipes)
    or the wall time runs out. Returns (stdout, stderr, truncated, limit, wait status)."""
    bufs = {o_r: bytearray(), e_r: bytearray()}
    truncated = False
    limit = None
    status: int | None = None
    usage: Any = None
    open_fds = [o_r, e_r]
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0 and status is None:
            limit = "wall_time"
            os.killpg(pid, signal.SIGKILL)
            _sweep()
            deadline = time.monotonic() + 1.0
            continue
        ready, _, _ = select.select(open_fds, [], [], min(max(left, 0.0), 0.05))
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            room = cap - len(bufs[fd])
            bufs[fd] += chunk[: max(0, room)]
            truncated = truncated or len(chunk) > room
        if status is None and not ready:
            done, st, ru = os.wait4(pid, os.WNOHANG)
            if done:
                status, usage = st, ru
                _sweep()  # a daemon it started would hold the pipes open
    if status is None:
        _, status, usage = os.wait4(pid, 0)
    return bufs[o_r], bufs[e_r], truncated, limit, status, usage


def _sweep() -> None:
    """Kill whatever the call left behind (daemons), and reap it: we are their subreaper."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def serve() -> None:
    _no_peeking()
    while True:
        (size,) = struct.unpack(">I", _read_exact(0, 4))
        req = json.loads(_read_exact(0, size))
        started = time.monotonic()
        i_r, i_w = os.pipe()
        o_r, o_w = os.pipe()
        e_r, e_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(i_w)
            os.close(o_r)
            os.close(e_r)
            _child(req, i_r, o_w, e_w)
        for fd in (i_r, o_w, e_w):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.write(i_w, req["stdin"].encode("latin-1"))
        os.close(i_w)
        out, err, truncated, limit, status, ru = _collect(
            pid, o_r, e_r, req["output_bytes"], started + req["wall_s"]
        )
        os.close(o_r)
        os.close(e_r)
        code = os.waitstatus_to_exitcode(status)
        _sweep()
        reply = {
            "exit_status": 128 - code if code < 0 else code,
            "stdout": out.decode("latin-1"),
            "stderr": err.decode("latin-1"),
            "truncated": truncated,
            "limit": limit,
            "duration_ms": (time.monotonic() - started) * 1000,
            "usage": {"cpu_s": ru.ru_utime + ru.ru_stime, "memory_peak_mb": ru.ru_maxrss / 1024},
        }
        body = json.dumps(reply).encode()
        os.write(1, struct.pack(">I", len(body)) + body)


if __name__ == "__main__":
    serve()
