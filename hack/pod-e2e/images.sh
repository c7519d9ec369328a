#!/usr/bin/env bash
# Container images without a registry or a Docker engine, with buildah (storage under the cache):
#
#   images.sh base       python:3.11-slim stand-in: Debian bookworm from debootstrap (cached)
#   images.sh pause      registry.k8s.io/pause:$PAUSE_VERSION from the pause binary (cached)
#   images.sh operator   the project's Dockerfile, unchanged, built offline from wheels made here
#   images.sh serving    the stand-in serving image (tests/pod_e2e/serving/Dockerfile)
#   images.sh archive IMAGE FILE [docker|oci]   write an image to an archive
#
# Offline means: `--pull=never --network none`, with pip pointed at a folder of wheels built on the
# host (pip.conf: no-index, find-links), so the Dockerfile's own `pip install` runs as written.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/hack/versions.env"
CACHE_DIR=${SOVEREIGNSPEC_CACHE:-$HOME/.cache/sovereignspec}
BIN_DIR=$CACHE_DIR/bin
STORE=$CACHE_DIR/buildah
BASE_IMAGE=docker.io/library/python:3.11-slim
PAUSE_IMAGE=registry.k8s.io/pause:$PAUSE_VERSION
OPERATOR_IMAGE=${OPERATOR_IMAGE:-ghcr.io/sovereignspec/sovereignspec:e2e}
SERVING_IMAGE=${SERVING_IMAGE:-localhost/sovereignspec-serving-standin:e2e}
PYTHON=${PYTHON:-python3}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

log() { printf '[images] %s\n' "$*" >&2; }
# vfs: no overlay mounts to leave behind, whatever the filesystem under the cache.
bah() { buildah --root "$STORE/storage" --runroot "$STORE/run" --storage-driver vfs "$@"; }
have() { bah inspect --type image "$1" >/dev/null 2>&1; }

base() {
  have "$BASE_IMAGE" && { log "base $BASE_IMAGE cached"; return; }
  local work; work=$(mktemp -d -p "$TMP")
  log "debootstrap bookworm (minbase, python3) for $BASE_IMAGE (log: $CACHE_DIR/debootstrap.log)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/root" \
    http://deb.debian.org/debian >"$CACHE_DIR/debootstrap.log" 2>&1 ||
    { tail -n 30 "$CACHE_DIR/debootstrap.log" >&2; exit 1; }
  # The official image's layout: an interpreter with pip whose prefix is /usr/local.
  chroot "$work/root" python3 -m venv /usr/local >>"$CACHE_DIR/debootstrap.log" 2>&1
  rm -rf "$work/root"/var/cache/apt/* "$work/root"/var/lib/apt/lists/* "$work/root"/dev/*
  tar -C "$work/root" --numeric-owner -cf "$work/rootfs.tar" .
  local ctr; ctr=$(bah from scratch)
  bah add "$ctr" "$work/rootfs.tar" / >/dev/null
  bah config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 "$ctr"
  bah commit --quiet "$ctr" "$BASE_IMAGE" >/dev/null
  bah rm "$ctr" >/dev/null
  log "committed $BASE_IMAGE"
}

pause() {
  have "$PAUSE_IMAGE" && { log "pause $PAUSE_IMAGE cached"; return; }
  local ctr; ctr=$(bah from scratch)
  bah copy --chmod 0755 "$ctr" "$BIN_DIR/pause-$KUBERNETES_VERSION" /pause >/dev/null
  bah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  bah commit --quiet "$ctr" "$PAUSE_IMAGE" >/dev/null
  bah rm "$ctr" >/dev/null
  log "committed $PAUSE_IMAGE"
}

# Wheels for the Dockerfile's `pip install .`: the project's dependencies and its build backend.
wheels() { # DIR
  "$PYTHON" -m pip wheel --quiet --wheel-dir "$1" "$repo" hatchling >&2
  printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$1/pip.conf"
}

build() { # IMAGE DOCKERFILE CONTEXT
  local work; work=$(mktemp -d -p "$TMP")
  base
  wheels "$work/wheels"
  log "building $1 from $2 (offline)"
  bah bud --quiet --pull=never --network none --layers=false \
    -v "$work/wheels:/wheels:ro" -v "$work/wheels/pip.conf:/etc/pip.conf:ro" \
    -f "$2" -t "$1" "$3" >/dev/null
  log "built $1"
}

case ${1:-} in
  base) base ;;
  pause) pause ;;
  operator) build "$OPERATOR_IMAGE" "${DOCKERFILE:-$repo/Dockerfile}" "${CONTEXT:-$repo}" ;;
  serving) build "$SERVING_IMAGE" "$repo/tests/pod_e2e/serving/Dockerfile" "$repo/tests/pod_e2e/serving" ;;
  archive) bah push --quiet "$2" "${4:-docker}-archive:$3:$2" >/dev/null ;;
  *) echo "usage: $0 base|pause|operator|serving|archive IMAGE FILE [docker|oci]" >&2; exit 2 ;;
esac
