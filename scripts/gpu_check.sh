#!/usr/bin/env bash
# Device check for the KV-compaction kernels, for a host with a CUDA GPU (the lent H200):
# the kernel tests compiled (the tests marked `gpu`), then the benchmark at real shapes.
# Uses the host's own python3 with torch and triton; writes logs under $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gearshift-gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$out/gpu.txt"
python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider -o addopts="" -o asyncio_mode=auto \
  -W "ignore::pytest.PytestConfigWarning" 2>&1 | tee "$out/tests.txt"
python3 -m bench.kv_compaction 2>&1 | tee "$out/bench.txt"
