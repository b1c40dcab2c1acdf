"""``bench.procs``: the CPU a benchmark reads of a process tree, at the scheduler's
resolution, counts live threads and what their processes reaped."""

from __future__ import annotations

import subprocess
import sys

from bench.procs import tree_cpu_seconds, tree_run_seconds

# burns CPU in a child (``reap``: a grandchild it waits for), prints its own CPU, then waits
BURN = """
import subprocess, sys, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
if sys.argv[1] == "reap":
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"], check=True)
else:
    burn(0.3)
print(time.process_time(), flush=True)
sys.stdin.read()
"""


def _burnt(mode: str) -> tuple[float, float, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BURN, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        own = float(proc.stdout.readline())
        return own, tree_run_seconds(proc.pid), tree_cpu_seconds(proc.pid, reaped=True)
    finally:
        proc.communicate("")


def test_a_busy_process_is_counted_to_within_a_clock_tick() -> None:
    own, run, ticks = _burnt("self")
    assert own >= 0.3
    assert abs(run - own) < 0.02, (run, own)  # own: this process alone, read just before
    assert abs(run - ticks) <= 0.03, (run, ticks)


def test_an_ended_child_is_counted_through_its_parent() -> None:
    own, run, _ = _burnt("reap")
    assert own < 0.3  # the burning was the child's
    assert run >= 0.3 + own - 0.02, (run, own)
