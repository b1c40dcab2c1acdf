"""Process helpers for benchmarks: start pinned to a core, wait for a port, read CPU time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def pinned(argv: Sequence[str], core: int | None) -> list[str]:
    """Prefix ``argv`` with taskset when there is a core to pin to and taskset exists."""
    if core is None or shutil.which("taskset") is None or core >= (os.cpu_count() or 1):
        return list(argv)
    return ["taskset", "-c", str(core), *argv]


def start(
    argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 180) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{url}: process exited with {proc.returncode}; log:\n{log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} not ready after {timeout_s}s; log:\n{log.read_text()[-2000:]}")


def proc_stats() -> dict[int, list[str]]:
    """The ``/proc/<pid>/stat`` fields after the command name, by pid, of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone since the listing
                continue
            out[int(entry)] = raw.rsplit(")", 1)[1].split()  # the name may hold ")"
    return out


def process_tree(pid: int, stats: dict[int, list[str]] | None = None) -> list[int]:
    """``pid`` and its live descendants."""
    stats = proc_stats() if stats is None else stats
    children: dict[int, list[int]] = {}
    for child, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(child)  # field 4: ppid
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def tree_cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User + system CPU seconds of ``pid`` and all its live descendants; with ``reaped``
    also what the children they already reaped used (``cutime``/``cstime``: a short-lived
    run or engine process counts after it ended)."""
    stats = proc_stats()
    last = 15 if reaped else 13  # utime, stime[, cutime, cstime]: fields 14-17
    ticks = sum(int(v) for p in process_tree(pid, stats) if p in stats for v in stats[p][11:last])
    return ticks / CLK_TCK


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` alone (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_run_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants at the scheduler's resolution: each
    live thread's run time in nanoseconds (``/proc/<pid>/task/<tid>/schedstat``), where
    ``tree_cpu_seconds`` counts 10 ms clock ticks; plus, in ticks, what they reaped of their
    ended children (``cutime``/``cstime``). A thread that ended is not counted. A process
    whose threads show no schedstat (a kernel without it) counts its ticks instead."""
    stats = proc_stats()
    total = 0.0
    for p in process_tree(pid, stats):
        if p not in stats:
            continue
        fields = stats[p]
        total += (int(fields[13]) + int(fields[14])) / CLK_TCK  # reaped children
        run_ns = _threads_run_ns(p)
        total += (
            run_ns / 1e9 if run_ns is not None else (int(fields[11]) + int(fields[12])) / CLK_TCK
        )
    return total


def _threads_run_ns(pid: int) -> int | None:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone since the listing
        return None
    found, total = False, 0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            found = True
        except (OSError, ValueError, IndexError):  # ended, or no schedstat here
            continue
    return total if found else None
