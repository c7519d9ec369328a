#!/usr/bin/env bash
# One real node beside the local control plane (hack/cluster-up.sh, started with
# SOVEREIGNSPEC_WITH_NODE=1): kube-controller-manager, kube-scheduler, containerd 2.x and a kubelet,
# all on loopback, state under the control plane's state directory, PIDs recorded for node-down.sh.
#
# The pod network lives in the network namespace hack/pod-e2e/netns.sh made, which this runs in: the
# CNI bridge plugin attaches each Pod to its bridge (cni0) and host-local gives it an address of
# SOVEREIGNSPEC_POD_RANGE; the Pods reach the API server on the bridge's address. There is no
# registry: images are imported into containerd from archives (IMAGES="a.tar b.tar").
set -euo pipefail
source "$(dirname "$0")/../cluster-lib.sh"
: "${SOVEREIGNSPEC_POD_GATEWAY:?run inside hack/pod-e2e/netns.sh: the pod network needs its namespace}"
bridge_has "$SOVEREIGNSPEC_POD_GATEWAY" ||
  { log "no bridge cni0 with $SOVEREIGNSPEC_POD_GATEWAY in this network namespace: run inside hack/pod-e2e/netns.sh"; exit 1; }

KUBELET_PORT=${SOVEREIGNSPEC_KUBELET_PORT:-20250}
KUBELET_HEALTHZ_PORT=${SOVEREIGNSPEC_KUBELET_HEALTHZ_PORT:-20248}
SCHEDULER_PORT=${SOVEREIGNSPEC_SCHEDULER_PORT:-20259}
CONTROLLER_MANAGER_PORT=${SOVEREIGNSPEC_CONTROLLER_MANAGER_PORT:-20257}
NODE_NAME=127.0.0.1 # kubelet refuses a loopback --node-ip; the name makes the InternalIP 127.0.0.1

node=$STATE_DIR/node
pki=$STATE_DIR/pki
[[ -f $pki/ca.key ]] || { log "no control plane in $STATE_DIR: run hack/cluster-up.sh first"; exit 1; }
mkdir -p "$node"/{bin,cni/net.d,containerd,kubelet,pod-logs}

# Host paths that the kubelet and containerd create whatever they are told; node-down.sh removes
# those that did not exist before.
for path in /var/lib/kubelet /run/containerd /var/log/containers /var/log/pods /etc/cni; do
  [[ -e $path ]] || echo "$path" >>"$node/created-host-paths"
done

"$HACK_DIR/pod-e2e/packages.sh"
"$HACK_DIR/build-binaries.sh" node

issue() { # NAME SUBJECT
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" >/dev/null 2>&1
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
    -extfile "$pki/$1.ext" -out "$pki/$1.crt" >/dev/null 2>&1
  cat >"$STATE_DIR/$1.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: sovereignspec-local
  cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: $1
  context: {cluster: sovereignspec-local, user: $1}
current-context: $1
YAML
}
# Each component under the identity its bootstrap RBAC roles are written for.
issue kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
issue kube-scheduler "/CN=system:kube-scheduler"
issue kube-controller-manager "/CN=system:kube-controller-manager"

# --- containerd --------------------------------------------------------------------------------
ln -sf "$BIN_DIR/containerd-shim-runc-v2-$CONTAINERD_VERSION" "$node/bin/containerd-shim-runc-v2"
ln -sf "$BIN_DIR/ctr-$CONTAINERD_VERSION" "$node/bin/ctr"
CNI_BIN=$BIN_DIR/cni-$CNI_PLUGINS_VERSION
cat >"$node/cni/net.d/10-pod-network.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "pod-network", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$node/cni/ipam",
            "ranges": [[{"subnet": "$SOVEREIGNSPEC_POD_SUBNET", "rangeStart": "${SOVEREIGNSPEC_POD_RANGE%-*}",
                         "rangeEnd": "${SOVEREIGNSPEC_POD_RANGE#*-}", "gateway": "$SOVEREIGNSPEC_POD_GATEWAY"}]]}},
  {"type": "loopback"}]}
JSON
SOCK=$node/containerd/containerd.sock
cat >"$node/containerd.toml" <<TOML
version = 3
root = "$node/containerd/root"
state = "$node/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:$PAUSE_VERSION"
[plugins.'io.containerd.cri.v1.runtime']
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower OOM scores below its own
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$node/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
TOML
ctr_() { "$node/bin/ctr" --address "$SOCK" "$@"; }
launch_containerd() {
  log "starting containerd $CONTAINERD_VERSION"
  PATH=$node/bin:$PATH start containerd "$BIN_DIR/containerd-$CONTAINERD_VERSION" --config "$node/containerd.toml"
}
bring_up containerd launch_containerd 60 ctr_ version
for archive in ${IMAGES:-}; do
  log "importing $(basename "$archive") into containerd"
  ctr_ -n k8s.io images import --no-unpack=false "$archive" >>"$STATE_DIR/logs/containerd.log" 2>&1 ||
    die_with_log containerd "importing $archive failed"
done

# --- controller-manager and scheduler ------------------------------------------------------------
launch_controller_manager() {
  log "starting kube-controller-manager $KUBERNETES_VERSION"
  # Short grace periods: the simulated nodes of deploy/examples never post status, and should be
  # marked unreachable (and tainted) within seconds, as a dead node is in a real cluster.
  start kube-controller-manager "$BIN_DIR/kube-controller-manager-$KUBERNETES_VERSION" \
    --kubeconfig "$STATE_DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE_DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE_DIR/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$CONTROLLER_MANAGER_PORT" \
    --use-service-account-credentials --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" --leader-elect=false \
    --node-monitor-grace-period 20s --node-startup-grace-period 10s \
    --controllers '*,-nodeipam,-route,-service,-cloud-node-lifecycle,-bootstrapsigner,-tokencleaner' --v 1
}
bring_up kube-controller-manager launch_controller_manager 60 \
  curl -sfk "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz"

launch_scheduler() {
  log "starting kube-scheduler $KUBERNETES_VERSION"
  start kube-scheduler "$BIN_DIR/kube-scheduler-$KUBERNETES_VERSION" \
    --kubeconfig "$STATE_DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE_DIR/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE_DIR/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --v 1
}
bring_up kube-scheduler launch_scheduler 60 curl -sfk "https://127.0.0.1:$SCHEDULER_PORT/healthz"

# --- kubelet -----------------------------------------------------------------------------------
echo "nameserver 127.0.0.1" >"$node/resolv.conf" # Pods never ask the VM's resolver
cat >"$node/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
containerRuntimeEndpoint: unix://$SOCK
# This machine kind runs cgroup v1, which kubelet >= 1.35 refuses unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: $node/resolv.conf
podLogsDirectory: $node/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
launch_kubelet() {
  log "starting kubelet $KUBERNETES_VERSION"
  PATH=$node/bin:$PATH start kubelet "$BIN_DIR/kubelet-$KUBERNETES_VERSION" --config "$node/kubelet.yaml" \
    --kubeconfig "$STATE_DIR/kubelet.kubeconfig" --hostname-override "$NODE_NAME" \
    --root-dir "$node/kubelet" --v 1
}
node_ready() {
  [[ $(kctl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
bring_up kubelet launch_kubelet 180 node_ready
log "node $NODE_NAME is Ready (kubelet https://127.0.0.1:$KUBELET_PORT, containerd $SOCK)"
