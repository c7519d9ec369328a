#!/usr/bin/env bash
# Start the local multi-cluster's control planes: a MultiKueue manager (its dispatcher set to
# SovereignSpec, Kueue's MutatingAdmissionPolicy that clears nominatedClusterNames installed) and
# two workers. `python -m localdev.multicluster up` (make multicluster-up) runs this,
# then configures MultiKueue, the queues, simulated GPU nodes and telemetry in each.
set -euo pipefail
source "$(dirname "$0")/multicluster-lib.sh"
mkdir -p "$MC_DIR"

manager_extra=$MC_DIR/manager-kueue-extra.yaml
cat >"$manager_extra" <<YAML
multiKueue:
  # Kueue dispatches only to the workers SovereignSpec nominates (status.nominatedClusterNames).
  dispatcherName: sovereignspec.io/dispatcher
  gcInterval: 30s
YAML

for member in "${MC_MEMBERS[@]}"; do
  name=${member%%:*} i=${member##*:}
  extra=()
  [[ $name == manager ]] && extra=("SOVEREIGNSPEC_KUEUE_CONFIG_EXTRA=$manager_extra")
  # shellcheck disable=SC2046 # mc_env prints NAME=VALUE words
  env $(mc_env "$i" "$name") "${extra[@]}" "$MC_HACK_DIR/cluster-up.sh" >"$MC_DIR/$name.up.log" 2>&1 || {
    cat "$MC_DIR/$name.up.log" >&2
    echo "[multicluster] $name failed to start; stopping the others" >&2
    "$MC_HACK_DIR/multicluster-down.sh" >&2 || true
    exit 1
  }
  echo "[multicluster] $name up: https://127.0.0.1:1744$i (kubeconfig $MC_DIR/$name/admin.kubeconfig)" >&2
done

# Kueue clears nominatedClusterNames through this policy when a worker admits or the workload is
# evicted, whoever owns the field (Kubernetes 1.36+): an external dispatcher relies on it.
source "$MC_HACK_DIR/cluster-lib.sh"
KUEUE_DIR=$("$MC_HACK_DIR/build-binaries.sh" crd-dir)
KUEUE_DIR=${KUEUE_DIR%/config/components/crd/bases}
"$KUBECTL_BIN" --kubeconfig "$MC_DIR/manager/admin.kubeconfig" apply --server-side \
  --field-manager sovereignspec-harness -f "$KUEUE_DIR/config/components/map/manifests.yaml" >&2
