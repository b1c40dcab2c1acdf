"""Convert the default model's GGUF file into a Hugging Face safetensors folder.

Run by ``backends.provision`` with the vLLM virtualenv's interpreter (it needs
torch, transformers, gguf and accelerate, which the gateway's own environment
does not carry). Standard library and transformers only: this file is executed
as a script, not imported as part of the package.

Usage: python convert_gguf.py DIST_NAME GGUF_SUFFIX OUT_DIR CHAT_TEMPLATE_FILE
       python convert_gguf.py --gguf GGUF_PATH OUT_DIR   (the GGUF's own chat template)
Prints one JSON line {"event": ..., ...} per stage on stdout.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
from pathlib import Path


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def find_gguf(dist_name: str, suffix: str) -> Path:
    dist = importlib.metadata.distribution(dist_name)
    for entry in dist.files or ():
        if str(entry).endswith(suffix):
            return Path(str(dist.locate_file(entry)))
    raise SystemExit(f"package {dist_name} holds no file ending in {suffix}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert(gguf: Path, out: Path, template: str | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    emit("stage", name="load-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    emit("stage", name="dequantize-weights")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized on load; what remains of the GGUF quantizer
    # only makes save_pretrained refuse to write them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    emit("stage", name="save-safetensors")
    model.save_pretrained(str(tmp), safe_serialization=True)
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(tmp))
    (tmp / "gearshift-source.json").write_text(
        json.dumps({"gguf": gguf.name, "sha256": sha256(gguf)}, indent=2)
    )
    for f in tmp.rglob("*"):  # save_pretrained writes 0600; a tier may run as another user
        f.chmod(0o755 if f.is_dir() else 0o644)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    emit("done", seconds=round(time.monotonic() - started, 1), path=str(out))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--locate":
        dist, suffix = argv[1].split(":", 1)
        path = find_gguf(dist, suffix)
        emit("located", path=str(path), size=path.stat().st_size, sha256=sha256(path))
        return 0
    if len(argv) == 3 and argv[0] == "--gguf":
        convert(Path(argv[1]), Path(argv[2]), None)
        return 0
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    dist, suffix, out, template_file = argv
    convert(find_gguf(dist, suffix), Path(out), Path(template_file).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
