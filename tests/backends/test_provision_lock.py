"""Two provisionings of the same folder at once: the second waits for the first's build and
uses it, instead of building the same folder over it (found when an install and a test run
on a fresh machine both built the fast tier, each at half speed, into one folder)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from backends.provision import COMPLETE_MARKER, building

BUILDER = """
import sys, time
from pathlib import Path
from backends.provision import COMPLETE_MARKER, building
out = Path(sys.argv[1])
with building(out) as needed:
    print("needed" if needed else "built by another", flush=True)
    if needed:
        time.sleep(float(sys.argv[2]))
        out.mkdir(exist_ok=True)
        (out / COMPLETE_MARKER).write_text("done")
"""


def test_a_second_build_of_one_folder_waits_and_builds_nothing(tmp_path: Path) -> None:
    out = tmp_path / "models" / "m-pruned-0123456789"
    first = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(out), "1.5"], stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None and first.stdout.readline().strip() == "needed"
    started = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-c", BUILDER, str(out), "0"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    said = second.stdout.strip().splitlines()
    assert said[-1] == "built by another" and "waiting for it" in said[0]
    assert time.monotonic() - started > 0.5  # it waited for the first build to end
    assert first.wait(timeout=60) == 0
    assert (out / COMPLETE_MARKER).read_text() == "done"
    assert not list(out.parent.glob("m-*.lock"))  # the lock is hidden from model globs


def test_an_unbuilt_folder_is_needed_and_a_built_one_is_not(tmp_path: Path) -> None:
    out = tmp_path / "m"
    with building(out) as needed:
        assert needed
        out.mkdir()
        (out / COMPLETE_MARKER).write_text("x")
    with building(out) as needed:
        assert not needed
