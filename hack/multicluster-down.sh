#!/usr/bin/env bash
# Stop every member of the local multi-cluster that runs (workers first), remove its state.
set -uo pipefail
source "$(dirname "$0")/multicluster-lib.sh"
rc=0
for ((k = ${#MC_MEMBERS[@]} - 1; k >= 0; k--)); do
  member=${MC_MEMBERS[$k]} name=${MC_MEMBERS[$k]%%:*} i=${MC_MEMBERS[$k]##*:}
  [[ -d $MC_DIR/$name ]] || continue
  # shellcheck disable=SC2046
  env $(mc_env "$i" "$name") "$MC_HACK_DIR/cluster-down.sh" || rc=1
done
rm -rf "$MC_DIR"
exit $rc
