#!/usr/bin/env bash
# Bring up a real control plane on loopback: etcd, kube-apiserver (RBAC, client certificates) and
# the Kueue manager (its batch/job, pod, deployment, statefulset and leaderworkerset integrations,
# webhooks served on 127.0.0.1) and the LeaderWorkerSet controller, from pinned Go modules.
#
#   hack/cluster-up.sh        # builds what is not cached, starts, waits, prints where things are
#   hack/cluster-down.sh      # stops exactly what this started and removes the state directory
#
# Re-running while the control plane is healthy does nothing but print it. If a component fails to
# build or become ready, the script names it, prints the tail of its log and stops what it started.
#
# SOVEREIGNSPEC_ETCD_FLAGS and SOVEREIGNSPEC_APISERVER_FLAGS add flags (split on spaces) to etcd and
# the API server: `make bench-flood` runs without the API server's watch cache, which at its full
# size would hold ~1 GB of label maps decoded, with their history. A control plane that is up with
# other extra flags is restarted with these.
set -euo pipefail
source "$(dirname "$0")/cluster-lib.sh"

started_here=0
on_exit() {
  local rc=$?
  if ((rc != 0 && started_here)); then
    log "cluster-up failed; stopping what it started"
    "$HACK_DIR/cluster-down.sh" >/dev/null 2>&1 || true
  fi
  exit $rc
}
trap on_exit EXIT

print_summary() {
  cat <<TXT
SovereignSpec local control plane is up (state: $STATE_DIR)
  etcd            $ETCD_VERSION   http://127.0.0.1:$ETCD_PORT     pid $(pid_of etcd)   log $STATE_DIR/logs/etcd.log
  kube-apiserver  $KUBERNETES_VERSION  https://127.0.0.1:$APISERVER_PORT  pid $(pid_of kube-apiserver)   log $STATE_DIR/logs/kube-apiserver.log
  kueue manager   $KUEUE_VERSION  health http://127.0.0.1:$KUEUE_HEALTH_PORT, webhooks https://127.0.0.1:$KUEUE_WEBHOOK_PORT  pid $(pid_of kueue)   log $STATE_DIR/logs/kueue.log
  lws controller  $LWS_VERSION   health http://127.0.0.1:$LWS_HEALTH_PORT, webhooks https://127.0.0.1:$LWS_WEBHOOK_PORT  pid $(pid_of lws)   log $STATE_DIR/logs/lws.log
  controllers     $KUBERNETES_VERSION  deployment, replicaset, statefulset  pid $(pid_of kube-controller-manager)   log $STATE_DIR/logs/kube-controller-manager.log
  kubeconfig      $KUBECONFIG_PATH   (admin; operator: $STATE_DIR/operator.kubeconfig)
  kubectl         $KUBECTL_BIN --kubeconfig $KUBECONFIG_PATH get clusterqueues
TXT
}

healthy() {
  alive etcd && alive kube-apiserver && alive kueue && alive lws &&
    { [[ ${SOVEREIGNSPEC_WITH_NODE:-0} == 1 ]] || alive kube-controller-manager; } &&
    curl -sf --cacert "$STATE_DIR/pki/ca.crt" --cert "$STATE_DIR/pki/admin.crt" --key "$STATE_DIR/pki/admin.key" \
      "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null &&
    curl -sf "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz" >/dev/null &&
    curl -sf "http://127.0.0.1:$LWS_HEALTH_PORT/readyz" >/dev/null
}

extra_flags="etcd: ${SOVEREIGNSPEC_ETCD_FLAGS:-}; kube-apiserver: ${SOVEREIGNSPEC_APISERVER_FLAGS:-}"
same_flags() { [[ "$(cat "$STATE_DIR/extra-flags" 2>/dev/null)" == "$extra_flags" ]]; }

if [[ -d $STATE_DIR ]]; then
  if ! same_flags; then
    log "up with other extra flags ($(cat "$STATE_DIR/extra-flags" 2>/dev/null || echo none)); restarting with: $extra_flags"
    "$HACK_DIR/cluster-down.sh" || exit 1
  elif healthy; then
    log "already up"
    print_summary
    exit 0
  fi
  log "found a stale state directory; cleaning it up first"
  "$HACK_DIR/cluster-down.sh" || exit 1
fi

for pair in "etcd:$ETCD_PORT" "etcd-peer:$ETCD_PEER_PORT" "kube-apiserver:$APISERVER_PORT" \
  "kueue-health:$KUEUE_HEALTH_PORT" "kueue-metrics:$KUEUE_METRICS_PORT" "kueue-webhook:$KUEUE_WEBHOOK_PORT" \
  "lws-health:$LWS_HEALTH_PORT" "lws-metrics:$LWS_METRICS_PORT" "lws-webhook:$LWS_WEBHOOK_PORT"; do
  if port_in_use "${pair#*:}"; then
    log "port ${pair#*:} (${pair%%:*}) is already in use on 127.0.0.1 by a process this script did not start."
    log "Stop it, or move ours with SOVEREIGNSPEC_*_PORT (see hack/cluster-lib.sh)."
    exit 1
  fi
done

"$HACK_DIR/build-binaries.sh" etcd
"$HACK_DIR/build-binaries.sh" kubernetes
"$HACK_DIR/build-binaries.sh" components
"$HACK_DIR/build-binaries.sh" kueue
"$HACK_DIR/build-binaries.sh" lws
KUEUE_DIR=$("$HACK_DIR/build-binaries.sh" crd-dir)
KUEUE_DIR=${KUEUE_DIR%/config/components/crd/bases}
LWS_DIR=$("$HACK_DIR/build-binaries.sh" lws-dir)
PYTHON=${PYTHON:-$REPO_DIR/.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3

mkdir -p "$STATE_DIR"/{pki,pids,logs,etcd,kueue/webhook-certs,lws/webhook-certs,manifests}
printf '%s' "$extra_flags" >"$STATE_DIR/extra-flags"
started_here=1

# --- certificates -------------------------------------------------------------------------------
pki=$STATE_DIR/pki
openssl_quiet() { openssl "$@" >/dev/null 2>&1; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=sovereignspec-local-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt"
# issue NAME SUBJECT [SAN]
issue() {
  local name=$1 subject=$2 san=${3:-}
  local ext=$pki/$name.ext
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=digitalSignature,keyEncipherment"
    if [[ -n $san ]]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$san"; else echo "extendedKeyUsage=clientAuth"; fi
  } >"$ext"
  openssl_quiet req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr"
  openssl_quiet x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$ext" -out "$pki/$name.crt"
}
# Loopback only, except inside hack/pod-e2e/netns.sh's namespace, whose Pods reach the API server on
# their bridge's address: there it listens on every address of that namespace (lo and the bridge).
bind=127.0.0.1 advertise=127.0.0.1 extra_san=""
if [[ -n ${SOVEREIGNSPEC_POD_GATEWAY:-} ]]; then
  bridge_has "$SOVEREIGNSPEC_POD_GATEWAY" ||
    { log "SOVEREIGNSPEC_POD_GATEWAY=$SOVEREIGNSPEC_POD_GATEWAY is not this network namespace's bridge (cni0): run inside hack/pod-e2e/netns.sh"; exit 1; }
  bind=0.0.0.0 advertise=$SOVEREIGNSPEC_POD_GATEWAY extra_san=",IP:$SOVEREIGNSPEC_POD_GATEWAY"
fi
issue apiserver "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1$extra_san"
issue admin "/O=system:masters/CN=admin"
issue kueue "/CN=kueue-manager"
issue operator "/CN=sovereignspec-operator"
issue lws "/CN=lws-controller"
issue kube-controller-manager "/CN=system:kube-controller-manager"
issue webhook "/CN=kueue-webhook" "IP:127.0.0.1,DNS:localhost"
# How the apiserver authenticates to kubelets (logs, exec), when a node runs (make pod-e2e).
issue kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
cp "$pki/webhook.crt" "$STATE_DIR/kueue/webhook-certs/tls.crt"
cp "$pki/webhook.key" "$STATE_DIR/kueue/webhook-certs/tls.key"
cp "$pki/webhook.crt" "$STATE_DIR/lws/webhook-certs/tls.crt"
cp "$pki/webhook.key" "$STATE_DIR/lws/webhook-certs/tls.key"

kubeconfig() { # NAME USER
  cat >"$STATE_DIR/$1.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: sovereignspec-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: $1
  context: {cluster: sovereignspec-local, user: $2}
current-context: $1
YAML
}
kubeconfig admin admin
kubeconfig kueue kueue
kubeconfig lws lws
kubeconfig operator operator
kubeconfig kube-controller-manager kube-controller-manager

# Kueue insists on a metrics certificate at a fixed path when it does not manage certificates.
if [[ ! -d $KUEUE_METRICS_CERT_DIR ]]; then
  top=$KUEUE_METRICS_CERT_DIR # remember the topmost directory we create, so that down removes only that
  while [[ ! -d $(dirname "$top") ]]; do top=$(dirname "$top"); done
  if mkdir -p "$KUEUE_METRICS_CERT_DIR" 2>/dev/null; then
    echo "$top" >"$STATE_DIR/created-kueue-metrics-certs"
  else
    die_with_log kueue "needs $KUEUE_METRICS_CERT_DIR (hard-coded in cmd/kueue/main.go) and cannot create it; run as root"
  fi
fi
cp "$pki/webhook.crt" "$KUEUE_METRICS_CERT_DIR/tls.crt"
cp "$pki/webhook.key" "$KUEUE_METRICS_CERT_DIR/tls.key"

# --- processes (start, bring_up: hack/cluster-lib.sh) ------------------------------------------
launch_etcd() {
  log "starting etcd $ETCD_VERSION"
  start etcd "$ETCD_BIN" --name local --data-dir "$STATE_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --listen-metrics-urls "" \
    --log-level warn ${SOVEREIGNSPEC_ETCD_FLAGS:-}
}
bring_up etcd launch_etcd 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# Without a controller-manager nothing creates the `default` ServiceAccounts that the ServiceAccount
# admission plugin insists on; with a node (SOVEREIGNSPEC_WITH_NODE=1, make pod-e2e) it runs, and
# Pods get their projected ServiceAccount tokens as in any cluster.
# The audit log (metadata only) then tells who made each request: the pod test holds the operator
# to its ServiceAccount's identity with it.
admission=(--disable-admission-plugins ServiceAccount)
if [[ ${SOVEREIGNSPEC_WITH_NODE:-0} == 1 ]]; then
  printf 'apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n' \
    >"$STATE_DIR/audit-policy.yaml"
  admission=(--audit-policy-file "$STATE_DIR/audit-policy.yaml" --audit-log-path "$STATE_DIR/logs/audit.log"
    --audit-log-format json)
fi

launch_apiserver() {
  log "starting kube-apiserver $KUBERNETES_VERSION"
  start kube-apiserver "$APISERVER_BIN" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$bind" --advertise-address "$advertise" --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode Node,RBAC \
    --kubelet-client-certificate "$pki/kubelet-client.crt" --kubelet-client-key "$pki/kubelet-client.key" \
    "${admission[@]}" \
    --profiling=false --v 1 ${SOVEREIGNSPEC_APISERVER_FLAGS:-}
}
bring_up kube-apiserver launch_apiserver 120 curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  "https://127.0.0.1:$APISERVER_PORT/readyz"

log "installing Kueue's CRDs and RBAC from $KUEUE_DIR, LeaderWorkerSet's from $LWS_DIR"
kctl apply --server-side --field-manager sovereignspec-harness -f "$KUEUE_DIR/config/components/crd/bases" >"$STATE_DIR/logs/kubectl.log" 2>&1 ||
  die_with_log kubectl "applying Kueue's CRDs failed"
kctl apply --server-side --field-manager sovereignspec-harness -f "$LWS_DIR/config/crd/bases" >>"$STATE_DIR/logs/kubectl.log" 2>&1 ||
  die_with_log kubectl "applying LeaderWorkerSet's CRDs failed"
kctl wait --for condition=established --timeout 60s crd --all >>"$STATE_DIR/logs/kubectl.log" 2>&1 ||
  die_with_log kubectl "Kueue's CRDs were not established"
"$PYTHON" "$HACK_DIR/kueue_manifests.py" --kueue-dir "$KUEUE_DIR" --ca "$pki/ca.crt" \
  --webhook-url "https://127.0.0.1:$KUEUE_WEBHOOK_PORT" --out "$STATE_DIR/manifests" \
  --lws-dir "$LWS_DIR" --lws-webhook-url "https://127.0.0.1:$LWS_WEBHOOK_PORT"
kctl create namespace kueue-system >>"$STATE_DIR/logs/kubectl.log" 2>&1 || true
kctl apply --server-side --field-manager sovereignspec-harness -f "$STATE_DIR/manifests/kueue-rbac.yaml" \
  >>"$STATE_DIR/logs/kubectl.log" 2>&1 || die_with_log kubectl "applying Kueue's RBAC failed"
kctl apply --server-side --field-manager sovereignspec-harness -f "$STATE_DIR/manifests/lws-rbac.yaml" \
  >>"$STATE_DIR/logs/kubectl.log" 2>&1 || die_with_log kubectl "applying LeaderWorkerSet's RBAC failed"

# The LeaderWorkerSet controller first: Kueue's leaderworkerset integration needs its API, and its
# pod webhook labels the group's pods before Kueue's sees them.
cat >"$STATE_DIR/lws/config.yaml" <<YAML
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
health:
  healthProbeBindAddress: 127.0.0.1:$LWS_HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$LWS_METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $LWS_WEBHOOK_PORT
  certDir: $STATE_DIR/lws/webhook-certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
YAML
launch_lws() {
  log "starting the LeaderWorkerSet controller $LWS_VERSION"
  start lws "$LWS_BIN" --config "$STATE_DIR/lws/config.yaml" --kubeconfig "$STATE_DIR/lws.kubeconfig" --zap-log-level info
}
bring_up lws launch_lws 120 curl -sf "http://127.0.0.1:$LWS_HEALTH_PORT/readyz"
wait_for lws 60 port_in_use "$LWS_WEBHOOK_PORT"
kctl apply --server-side --field-manager sovereignspec-harness -f "$STATE_DIR/manifests/lws-webhooks.yaml" \
  >>"$STATE_DIR/logs/kubectl.log" 2>&1 || die_with_log kubectl "registering LeaderWorkerSet's webhooks failed"

cat >"$STATE_DIR/kueue/config.yaml" <<YAML
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$KUEUE_METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $STATE_DIR/kueue/webhook-certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
# No kubelet runs pods here, so no pod ever becomes ready: do not evict admitted workloads for it.
waitForPodsReady:
  timeout: 24h
  blockAdmission: false
manageJobsWithoutQueueName: false
integrations:
  frameworks: ["batch/job", "pod", "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"]
clientConnection:
  qps: 200
  burst: 400
YAML
# More configuration for this cluster's role (a MultiKueue manager's multiKueue section: make multicluster-up).
if [[ -n ${SOVEREIGNSPEC_KUEUE_CONFIG_EXTRA:-} ]]; then
  cat "$SOVEREIGNSPEC_KUEUE_CONFIG_EXTRA" >>"$STATE_DIR/kueue/config.yaml"
fi

launch_kueue() {
  log "starting kueue manager $KUEUE_VERSION"
  start kueue "$KUEUE_BIN" --config "$STATE_DIR/kueue/config.yaml" --kubeconfig "$STATE_DIR/kueue.kubeconfig" \
    --feature-gates VisibilityOnDemand=false --zap-log-level info
}
bring_up kueue launch_kueue 120 curl -sf "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz"
wait_for kueue 60 port_in_use "$KUEUE_WEBHOOK_PORT"

# The apiserver calls Kueue's webhooks from now on: Jobs with a queue name are suspended on
# creation and Kueue's validation runs, as in a real cluster.
kctl apply --server-side --field-manager sovereignspec-harness -f "$STATE_DIR/manifests/kueue-webhooks.yaml" \
  >>"$STATE_DIR/logs/kubectl.log" 2>&1 || die_with_log kubectl "registering Kueue's webhooks failed"
probe_webhook() {
  kctl create --dry-run=server -f - <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: harness-webhook-probe}
YAML
}
wait_for kueue 60 probe_webhook

# The workload controllers, so that Deployments, StatefulSets and LeaderWorkerSets get their Pods
# (through Kueue's pod webhook, gated) as in any cluster. Only those: no node lifecycle (the
# simulated GPU nodes post no status and must not be tainted), no garbage collector (the tests
# delete what they make). Each controller runs under its own ServiceAccount, as kubeadm runs it.
# With a node (make pod-e2e) hack/pod-e2e/node-up.sh starts the whole controller-manager instead.
launch_controller_manager() {
  log "starting kube-controller-manager $KUBERNETES_VERSION (deployment, replicaset, statefulset)"
  start kube-controller-manager "$CONTROLLER_MANAGER_BIN" \
    --kubeconfig "$STATE_DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE_DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE_DIR/kube-controller-manager.kubeconfig" \
    --secure-port 0 --use-service-account-credentials --leader-elect=false \
    --controllers deployment,replicaset,statefulset --v 2
}
controllers_started() { grep -q 'controller="statefulset-controller"' "$STATE_DIR/logs/kube-controller-manager.log"; }
if [[ ${SOVEREIGNSPEC_WITH_NODE:-0} != 1 ]]; then
  bring_up kube-controller-manager launch_controller_manager 60 controllers_started
fi

started_here=0
print_summary
