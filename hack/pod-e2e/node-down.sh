#!/usr/bin/env bash
# Undo node-up.sh and then the control plane: Pods' containers, kubelet, containerd and its shims,
# scheduler and controller-manager stopped by recorded PID; every mount under the state directory
# unmounted, the kubepods cgroups removed, host paths the node created removed; then
# hack/cluster-down.sh. Runs to the end whatever state a failed run left, and exits non-zero if
# anything of ours is still there afterwards.
set -uo pipefail
source "$(dirname "$0")/../cluster-lib.sh"
KUBELET_PORT=${SOVEREIGNSPEC_KUBELET_PORT:-20250}
KUBELET_HEALTHZ_PORT=${SOVEREIGNSPEC_KUBELET_HEALTHZ_PORT:-20248}
SCHEDULER_PORT=${SOVEREIGNSPEC_SCHEDULER_PORT:-20259}
CONTROLLER_MANAGER_PORT=${SOVEREIGNSPEC_CONTROLLER_MANAGER_PORT:-20257}
node=$STATE_DIR/node
SOCK=$node/containerd/containerd.sock

stop() { # NAME
  alive "$1" || return 0
  local pid; pid=$(pid_of "$1")
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null && sleep 0.2
  log "stopped $1 (pid $pid)"
}

stop kubelet # first, so that it restarts nothing while the containers go
if alive containerd; then
  ctr_() { timeout 20 "$node/bin/ctr" --address "$SOCK" -n k8s.io "$@"; }
  for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$task" >/dev/null 2>&1; done
  sleep 1
  for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$task" >/dev/null 2>&1; done
fi
stop containerd
# Shims outlive containerd by design (each in its own session); ours name our socket.
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
stop kube-scheduler
stop kube-controller-manager

# Whatever a Pod still runs is in a kubepods cgroup: kill it, then remove the cgroups deepest first.
for ctl in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
  [[ -d $ctl ]] || continue
  find "$ctl" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
done
sleep 0.3
for ctl in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
  [[ -d $ctl ]] && find "$ctl" -depth -type d -exec rmdir {} + 2>/dev/null
done

# Mounts under the state directory (rootfs overlays, projected volumes, network namespaces), deepest first.
if [[ -d $STATE_DIR ]]; then
  findmnt -rn -o TARGET | grep -F "$STATE_DIR/" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- |
    while read -r target; do umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null; done
fi
if [[ -f $node/created-host-paths ]]; then
  while read -r path; do
    case $path in /var/lib/kubelet | /run/containerd | /var/log/containers | /var/log/pods | /etc/cni) rm -rf "$path" ;; esac
  done <"$node/created-host-paths"
fi

"$HACK_DIR/cluster-down.sh"
rc=$?

left=()
for port in "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT" "$SCHEDULER_PORT" "$CONTROLLER_MANAGER_PORT"; do
  port_in_use "$port" && left+=("port $port listening")
done
pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" >/dev/null && left+=("containerd shims")
mounts=$(findmnt -rn -o TARGET) # read whole: a `| grep -q` under pipefail can miss a match
[[ $mounts == *"$STATE_DIR/"* ]] && left+=("mounts under $STATE_DIR")
for ctl in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do [[ -d $ctl ]] && left+=("cgroup $ctl"); done
if ((${#left[@]})); then
  log "left behind after node-down: ${left[*]}"
  exit 1
fi
exit $rc
