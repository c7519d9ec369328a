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

ETCD_BIN=$BIN_DIR/etcd-$ETCD_VERSION
APISERVER_BIN=$BIN_DIR/kube-apiserver-$KUBERNETES_VERSION
KUBECTL_BIN=$BIN_DIR/kubectl-$KUBERNETES_VERSION
KUEUE_BIN=$BIN_DIR/kueue-$KUEUE_VERSION
# Kueue reads its metrics serving certificate from this hard-coded path when it manages no certs.
KUEUE_METRICS_CERT_DIR=/etc/kueue/metrics/certs

COMPONENTS=(etcd kube-apiserver kueue)

log() { printf '[cluster] %s\n' "$*" >&2; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_of() { cat "$STATE_DIR/pids/$1.pid" 2>/dev/null || true; }

# True if the recorded PID is alive and still runs the binary we started (PIDs get reused).
alive() {
  local pid exe
  pid=$(pid_of "$1")
  [[ -n $pid ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ $exe == "$(cat "$STATE_DIR/pids/$1.exe" 2>/dev/null)" ]]
}

kctl() { "$KUBECTL_BIN" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
