# The local multi-cluster (sourced by multicluster-up.sh and multicluster-down.sh): one MultiKueue
# manager and two workers, each a control plane of its own (hack/cluster-up.sh with its own state
# directory and ports), all on 127.0.0.1.
MC_HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MC_DIR=${SOVEREIGNSPEC_MULTICLUSTER_DIR:-$(cd "$MC_HACK_DIR/.." && pwd)/.multicluster}
# name:index; the index picks the ports (2579i etcd, 2580i peer, 1744i apiserver, 1908i/1845i/1945i Kueue
# health/metrics/webhooks): below 32768, so that no client connection's ephemeral port takes one.
MC_MEMBERS=(manager:1 worker-eu:2 worker-kr:3)

mc_env() { # INDEX NAME: the environment hack/cluster-up.sh and cluster-down.sh read for one member
  local i=$1 name=$2
  echo "SOVEREIGNSPEC_CLUSTER_DIR=$MC_DIR/$name" \
    "SOVEREIGNSPEC_ETCD_PORT=2579$i" "SOVEREIGNSPEC_ETCD_PEER_PORT=2580$i" \
    "SOVEREIGNSPEC_APISERVER_PORT=1744$i" "SOVEREIGNSPEC_KUEUE_HEALTH_PORT=1908$i" \
    "SOVEREIGNSPEC_KUEUE_METRICS_PORT=1845$i" "SOVEREIGNSPEC_KUEUE_WEBHOOK_PORT=1945$i" \
    "SOVEREIGNSPEC_LWS_HEALTH_PORT=1918$i" "SOVEREIGNSPEC_LWS_METRICS_PORT=1855$i" "SOVEREIGNSPEC_LWS_WEBHOOK_PORT=1965$i"
}
