#!/usr/bin/env bash
# `scripts/install.sh --from BUNDLE.tar`: install from a bundle (scripts/bundle.sh) with no
# package index: pip runs with --no-index on the bundle's wheels only.
#
#   .venv/                      the gateway (not editable: the bundle's wheel)
#   $GEARSHIFT_HOME/vllm-venv   the engine, when the bundle has it
#   $GEARSHIFT_HOME/models      the converted models, when the bundle has them
#   images in the bundle are loaded with `podman load` when podman is here
set -euo pipefail
BUNDLE=$(realpath "$1")
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
GEARSHIFT_HOME=${GEARSHIFT_HOME:-$HOME/.cache/gearshift}
# only the bundle: no index, no configured mirrors or wheel folders (pip.conf ignored)
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_CONSTRAINT
export PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
step() { printf '\n==> %s\n' "$*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/gearshift-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xf "$BUNDLE" -C "$work"
step "bundle: $(head -1 "$work/MANIFEST"), $(grep '^parts' "$work/MANIFEST")"

step "gateway environment (.venv) from the bundle"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --no-index --find-links "$work/wheels/gateway" gearshift

if [ -d "$work/wheels/engine" ]; then
  step "engine environment ($GEARSHIFT_HOME/vllm-venv) from the bundle"
  reqs=$(sed -n 's/^engine //p' "$work/MANIFEST")
  rm -rf "$GEARSHIFT_HOME/vllm-venv" && mkdir -p "$GEARSHIFT_HOME"
  "$PY" -m venv "$GEARSHIFT_HOME/vllm-venv"
  model_pkg=${reqs##* }
  # shellcheck disable=SC2086
  "$GEARSHIFT_HOME/vllm-venv/bin/pip" install -q --no-index --find-links "$work/wheels/engine" ${reqs% *}
  "$GEARSHIFT_HOME/vllm-venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$GEARSHIFT_HOME/vllm-venv/bin/pip" install -q --no-index --no-deps --find-links "$work/wheels/engine" "$model_pkg"
  # Gearshift's vLLM plugin (kvplugin, loaded through an entry point), as install.sh and the
  # image put it there: the gateway's wheel, no dependencies, so the engine's pins stay
  "$GEARSHIFT_HOME/vllm-venv/bin/pip" install -q --no-index --no-deps --find-links "$work/wheels/gateway" gearshift
  printf '%s' "$reqs" > "$GEARSHIFT_HOME/vllm-venv/.gearshift-stamp"
fi
if [ -d "$work/models" ]; then
  step "models into $GEARSHIFT_HOME/models"
  mkdir -p "$GEARSHIFT_HOME/models" && cp -r "$work/models/." "$GEARSHIFT_HOME/models/"
fi
if [ -d "$work/images" ] && command -v podman >/dev/null; then
  for image in "$work"/images/*.tar; do step "image $(basename "$image")"; podman load -q -i "$image"; done
fi
step "installed: $(.venv/bin/gearshift --help | head -1)"
