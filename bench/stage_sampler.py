"""A CPU-time sampler inside the gateway's process, for bench.stage_cpu.

    python -m bench.stage_sampler OUT -- serve --config FILE ...

runs ``gearshift serve --config FILE ...`` in this process, as bench.stall_probe does,
with a timer on the process's CPU clock (``ITIMER_PROF``: a SIGPROF every INTERVAL_S of
CPU, whichever thread used it). Python runs the handler in the main thread (the event
loop's), between two bytecodes: it takes the main thread's Python stack and charges it the
main thread's CPU since the previous sample (``time.thread_time``), so a C call is charged
to the Python frame that made it and the other threads' CPU to no stack (``other_cpu_s``
in the header: the process's CPU less the main thread's).

On SIGUSR2 it writes what it counted since the previous SIGUSR2 (or since it started) to
OUT, replacing it, and starts counting again: a first line of JSON (``seq``, the number of
dumps so far; ``samples``; ``main_cpu_s``; ``other_cpu_s``) and then one line per distinct
stack, ``frame;frame;... microseconds``, outermost frame first, each frame
``qualname (file)`` with the file relative to site-packages or to the repository.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import CodeType, FrameType

INTERVAL_S = 0.005
DUMP_SIGNAL = signal.SIGUSR2
ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def frame_name(code: CodeType) -> str:
    path = code.co_filename
    if (i := path.find("site-packages/")) >= 0:
        path = path[i + len("site-packages/") :]
    elif path.startswith(ROOT):
        path = path[len(ROOT) :]
    return f"{code.co_qualname} ({path})"


class Sampler:
    """Counts the main thread's CPU by stack; ``dump`` writes and resets the counts."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.counts: dict[tuple[CodeType, ...], float] = {}
        self.samples = self.seq = 0
        self.dumping = False
        self.last = self.main0 = time.thread_time()
        self.process0 = time.process_time()

    def sample(self, signum: int, frame: FrameType | None) -> None:
        if self.dumping:  # a handler can run inside another one; the dump's CPU is its own
            return
        now = time.thread_time()
        stack = []
        while frame is not None:
            stack.append(frame.f_code)
            frame = frame.f_back
        key = tuple(stack)
        self.counts[key] = self.counts.get(key, 0.0) + (now - self.last)
        self.last = now
        self.samples += 1

    def dump(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.dumping = True
        try:
            main, process = time.thread_time(), time.process_time()
            self.seq += 1
            head = {"seq": self.seq, "samples": self.samples, "main_cpu_s": main - self.main0,
                    "other_cpu_s": (process - self.process0) - (main - self.main0)}  # fmt: skip
            lines = [json.dumps(head)]
            for stack, seconds in self.counts.items():
                names = ";".join(frame_name(code) for code in reversed(stack))
                lines.append(f"{names} {round(seconds * 1e6)}")
            tmp = self.out.with_name(self.out.name + ".tmp")
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, self.out)
            self.counts, self.samples = {}, 0
        finally:
            self.last = self.main0 = time.thread_time()
            self.process0 = time.process_time()
            self.dumping = False

    def install(self) -> None:
        signal.signal(signal.SIGPROF, self.sample)
        signal.signal(DUMP_SIGNAL, self.dump)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)

    def uninstall(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        signal.signal(DUMP_SIGNAL, signal.SIG_DFL)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    Sampler(Path(sys.argv[1])).install()
    from gateway.cli.main import main as gearshift

    sys.argv = ["gearshift", *sys.argv[3:]]
    gearshift()


if __name__ == "__main__":
    main()
