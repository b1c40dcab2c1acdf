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


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its live descendants."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw.rsplit(")", 1)[1].split()
        ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
        stats[int(entry)] = (ppid, (utime + stime) / CLK_TCK)
    total, frontier = 0.0, [pid]
    while frontier:
        current = frontier.pop()
        if current in stats:
            total += stats[current][1]
        frontier.extend(child for child, (ppid, _) in stats.items() if ppid == current)
    return total


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` alone (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK
