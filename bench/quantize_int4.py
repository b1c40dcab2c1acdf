"""Weight-only int4 copy of a model folder, in the GPTQ layout vLLM's CPU backend serves.

    ~/.cache/gearshift/vllm-venv/bin/python -m bench.quantize_int4 SRC_DIR [DST_DIR]

Round-to-nearest, symmetric, groups of 32 input channels (the default model's source GGUF,
Q4_1, also quantized blocks of 32), every attention and MLP projection; the embedding, which
is tied to the output head, stays bfloat16. No calibration data, no GPU: it runs in the vLLM
environment (torch, safetensors) in seconds. vLLM 0.32 reads ``quant_method: gptq`` with
4 bits and ``sym: true`` as ``uint4b8`` and on CPU hands the layers to
``CPUWNA16LinearKernel`` (``vllm/model_executor/kernels/linear/mixed_precision/cpu.py``:
input and output sizes multiples of 32, which SmolLM2's 576/192/1536 are). The default
destination is SRC_DIR with ``-int4`` appended (``bench.tier_levers`` looks for it there).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

GROUP = 32
BITS = 4
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize(weight, group: int = GROUP):  # type: ignore[no-untyped-def]
    """nn.Linear weight [out, in] -> (qweight int32 [in/8, out], scales fp16 [in/g, out],
    qzeros int32 [in/g, out/8], g_idx int32 [in]) in GPTQ's layout (values + 8, packed
    eight to an int32 along the input dimension)."""
    import torch

    w = weight.float().t().contiguous()  # [in, out]
    n_in, n_out = w.shape
    grouped = w.view(n_in // group, group, n_out)
    scales = (grouped.abs().amax(dim=1) / 7.0).clamp(min=1e-8)  # [in/g, out]
    q = torch.round(grouped / scales[:, None, :]).clamp(-8, 7).to(torch.int32) + 8
    q = q.view(n_in // 8, 8, n_out)
    qweight = torch.zeros(n_in // 8, n_out, dtype=torch.int32)
    for i in range(8):
        qweight |= q[:, i, :] << (BITS * i)
    # sym GPTQ ignores zero points; stored as 8 - 1 = 7 per nibble, as GPTQ v1 writes them
    qzeros = torch.full((n_in // group, n_out // 8), 0x77777777, dtype=torch.int64).to(torch.int32)  # fmt: skip
    g_idx = torch.arange(n_in, dtype=torch.int32) // group
    return qweight, scales.to(torch.float16), qzeros, g_idx


def convert(src: Path, dst: Path) -> Path:
    from safetensors.torch import load_file, save_file

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    out: dict[str, Any] = {}
    for path in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(str(path)).items():
            stem = name.removesuffix(".weight")
            if name.endswith(".weight") and stem.rsplit(".", 1)[-1] in PROJECTIONS:
                qweight, scales, qzeros, g_idx = quantize(tensor)
                out |= {f"{stem}.qweight": qweight, f"{stem}.scales": scales,
                        f"{stem}.qzeros": qzeros, f"{stem}.g_idx": g_idx}  # fmt: skip
            else:
                out[name] = tensor.contiguous()
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": BITS, "group_size": GROUP,
                                     "desc_act": False, "sym": True, "lm_head": False}  # fmt: skip
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def main(argv: list[str]) -> None:
    if not 1 <= len(argv) <= 2:
        raise SystemExit(__doc__)
    src = Path(argv[0]).expanduser()
    dst = Path(argv[1]).expanduser() if len(argv) == 2 else src.with_name(src.name + "-int4")
    print(convert(src, dst))


if __name__ == "__main__":
    main(sys.argv[1:])
