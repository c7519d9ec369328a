# Shared settings of the local control plane (sourced by cluster-up.sh and cluster-down.sh).
# Every port is on 127.0.0.1 and can be moved with the environment variable named beside it.
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$HACK_DIR/.." && pwd)
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"

CACHE_DIR=${SOVEREIGNSPEC_CACHE:-$HOME/.cache/sovereignspec}
BIN_DIR=$CACHE_DIR/bin
STATE_DIR=${SOVEREIGNSPEC_CLUSTER_DIR:-$REPO_DIR/.cluster}
KUBECONFIG_PATH=$STATE_DIR/admin.kubeconfig

ETCD_PORT=${SOVEREIGNSPEC_ETCD_PORT:-23790}
ETCD_PEER_PORT=${SOVEREIGNSPEC_ETCD_PEER_PORT:-23800}
APISERVER_PORT=${SOVEREIGNSPEC_APISERVER_PORT:-16443}
KUEUE_HEALTH_PORT=${SOVEREIGNSPEC_KUEUE_HEALTH_PORT:-18081}
KUEUE_METRICS_PORT=${SOVEREIGNSPEC_KUEUE_METRICS_PORT:-18443}
KUEUE_WEBHOOK_PORT=${SOVEREIGNSPEC_KUEUE_WEBHOOK_PORT:-19443}
LWS_HEALTH_PORT=${SOVEREIGNSPEC_LWS_HEALTH_PORT:-18082}
LWS_METRICS_PORT=${SOVEREIGNSPEC_LWS_METRICS_PORT:-18444}
LWS_WEBHOOK_PORT=${SOVEREIGNSPEC_LWS_WEBHOOK_PORT:-19444}

ETCD_BIN=$BIN_DIR/etcd-$ETCD_VERSION
APISERVER_BIN=$BIN_DIR/kube-apiserver-$KUBERNETES_VERSION
KUBECTL_BIN=$BIN_DIR/kubectl-$KUBERNETES_VERSION
KUEUE_BIN=$BIN_DIR/kueue-$KUEUE_VERSION
LWS_BIN=$BIN_DIR/lws-$LWS_VERSION
CONTROLLER_MANAGER_BIN=$BIN_DIR/kube-controller-manager-$KUBERNETES_VERSION
# Kueue reads its metrics serving certificate from this hard-coded path when it manages no certs.
KUEUE_METRICS_CERT_DIR=/etc/kueue/metrics/certs

log() { printf '[cluster] %s\n' "$*" >&2; }

# Whether the bridge cni0 of this network namespace carries ADDRESS. The output is read whole before
# it is matched: `ip ... | grep -q` under pipefail fails at random once the bridge has an IPv6
# address too (grep leaves at the first match and ip, still writing, dies of SIGPIPE).
bridge_has() { # ADDRESS
  local addrs
  addrs=$(ip -4 addr show dev cni0 2>/dev/null) || return 1
  [[ $addrs == *"inet $1/"* ]]
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_of() { cat "$STATE_DIR/pids/$1.pid" 2>/dev/null || true; }

# A process's start time (field 22 of /proc/PID/stat); empty for a zombie or a process that is gone.
# With the PID it names one process for good: a PID alone gets reused, and /proc/PID/exe is not the
# binary yet while the child is still bash or setsid, nor once the binary file has been replaced.
started_at() { # PID
  local stat fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  read -ra fields <<<"${stat##*) }" # fields from the state on (field 3): comm may hold spaces
  [[ ${fields[0]} != Z ]] && echo "${fields[19]}"
  return 0
}

# True if the recorded process is still running (checked by PID and start time, as PIDs get reused).
alive() {
  local pid want
  pid=$(pid_of "$1")
  want=$(cat "$STATE_DIR/pids/$1.start" 2>/dev/null) || return 1
  [[ -n $pid && -n $want && $(started_at "$pid") == "$want" ]]
}

kctl() { "$KUBECTL_BIN" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# --- starting processes (cluster-up.sh; tests/unit/test_cluster_scripts.py) ----------------------
die_with_log() {
  local component=$1 why=$2
  log "$component: $why"
  if [[ -f $STATE_DIR/logs/$component.log ]]; then
    log "last lines of $STATE_DIR/logs/$component.log:"
    tail -n 30 "$STATE_DIR/logs/$component.log" >&2
  fi
  exit 1
}

start() { # NAME BINARY ARGS...
  local name=$1 binary=$2 pid
  shift 2
  setsid "$binary" "$@" >"$STATE_DIR/logs/$name.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$STATE_DIR/pids/$name.pid"
  started_at "$pid" >"$STATE_DIR/pids/$name.start" # empty if it has already exited: never alive
}

# How a process this script started and that is no longer alive ended: its exit status or the
# signal that killed it, in ENDED. Not in a $(...): a subshell cannot wait for this shell's children.
ENDED=""
how_it_ended() { # NAME
  local rc
  wait "$(pid_of "$1")" 2>/dev/null && rc=0 || rc=$?
  if ((rc > 128)); then ENDED="killed by signal $((rc - 128)), SIG$(kill -l $((rc - 128)))"; else ENDED="exit status $rc"; fi
}

WHY=""
wait_ready() { # NAME SECONDS COMMAND... ; returns 1 with WHY set if it exits or times out first
  local name=$1 limit=$2 deadline=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      how_it_ended "$name"
      WHY="exited before becoming ready ($ENDED)"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      WHY="not ready after ${limit}s"
      return 1
    fi
    sleep 0.2
  done
}

wait_for() { # NAME SECONDS COMMAND...
  wait_ready "$@" || die_with_log "$1" "$WHY"
}

# Start a component and wait until it is ready. One that exits during start-up is started once
# more (its first log is kept beside the new one and its end reported); one that is merely slow is not.
bring_up() { # NAME LAUNCHER SECONDS READY-COMMAND...
  local name=$1 launcher=$2 limit=$3
  shift 3
  "$launcher"
  wait_ready "$name" "$limit" "$@" && return 0
  [[ $WHY == exited* ]] || die_with_log "$name" "$WHY"
  log "$name $WHY; last lines of its log:"
  tail -n 30 "$STATE_DIR/logs/$name.log" >&2
  mv "$STATE_DIR/logs/$name.log" "$STATE_DIR/logs/$name.first-attempt.log"
  log "starting $name once more"
  "$launcher"
  wait_for "$name" "$limit" "$@"
}
