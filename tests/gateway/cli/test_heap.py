import subprocess
import sys

from gateway.cli import heap

# in a child: freezing the heap and the interpreter's settings would outlive the test here
PROBE = """
import gc, sys
from gateway.cli import heap
frozen = heap.settle()
print(frozen, gc.get_threshold()[0], sys.getswitchinterval())
"""


def test_settle_freezes_start_up_and_shortens_the_switch_interval():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    frozen, young, interval = int(out[0]), int(out[1]), float(out[2])
    assert frozen > 1000  # the interpreter's own start-up objects at least
    assert young == heap.YOUNG_THRESHOLD
    assert interval == heap.SWITCH_INTERVAL_S < 0.005  # shorter than CPython's default
