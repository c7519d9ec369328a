#!/usr/bin/env bash
# The Debian packages the pod end-to-end test needs, installed only when missing (a fresh machine
# has none of them): runc for containerd, buildah to build the image without a daemon, debootstrap
# for the base image. (The CNI plugins are built from their Go module: hack/build-binaries.sh node.)
set -euo pipefail
need=()
for pair in runc:runc buildah:buildah debootstrap:debootstrap; do
  pkg=${pair%%:*} probe=${pair#*:}
  if [[ $probe == /* ]]; then [[ -e $probe ]] || need+=("$pkg"); else command -v "$probe" >/dev/null || need+=("$pkg"); fi
done
((${#need[@]} == 0)) && exit 0
echo "[pod-e2e] installing Debian packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
  { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
