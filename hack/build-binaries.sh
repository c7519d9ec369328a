#!/usr/bin/env bash
# Build etcd, kube-apiserver, kubectl, the controller-manager, the Kueue manager and the
# LeaderWorkerSet controller from pinned Go modules, once.
#
# Why wrapper modules: k8s.io/kubernetes and go.etcd.io/etcd/server/v3 carry `replace` directives
# in their go.mod, so `go install pkg@version` refuses them. A throwaway module that requires them
# (and, for Kubernetes, maps every staging module to its published v0.N.M) builds the same code.
# Nothing built here is committed: binaries land in $BIN_DIR, named with their version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

CACHE_DIR=${SOVEREIGNSPEC_CACHE:-$HOME/.cache/sovereignspec}
BIN_DIR=$CACHE_DIR/bin
mkdir -p "$BIN_DIR"
export GOFLAGS=-mod=mod
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { printf '[build] %s\n' "$*" >&2; }

fail() {
  local component=$1 logfile=$2
  log "FAILED to build $component; last lines of $logfile:"
  tail -n 40 "$logfile" >&2 || true
  exit 1
}

# One binary from a module through a throwaway wrapper module: NAME VERSION MODULE PACKAGE.
build_wrapped() {
  local name=$1 version=$2 module=$3 package=$4
  local out=$BIN_DIR/$name-$version
  [[ -x $out ]] && { log "$name $version cached"; return; }
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/build-$name.log
  log "building $name $version (log: $logf)"
  (
    cd "$work"
    go mod init "sovereignspec.local/$name-build"
    go get "$module@$version"
    go build -trimpath -ldflags '-s -w' -o "$out.tmp" "$package"
  ) >"$logf" 2>&1 || fail "$name" "$logf"
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

build_etcd() { build_wrapped etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3; }

build_kubernetes() {
  local apiserver=$BIN_DIR/kube-apiserver-$KUBERNETES_VERSION
  local kubectl=$BIN_DIR/kubectl-$KUBERNETES_VERSION
  [[ -x $apiserver && -x $kubectl ]] && { log "kube-apiserver/kubectl $KUBERNETES_VERSION cached"; return; }
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/build-kubernetes.log
  local staging=v0.${KUBERNETES_VERSION#v1.}
  log "building kube-apiserver and kubectl $KUBERNETES_VERSION (log: $logf)"
  (
    cd "$work"
    go mod init sovereignspec.local/kubernetes-build
    # Map every staging module named in the tag's go.mod to its published version.
    modfile=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$modfile" | awk '{print $1}' | sort -u >staging.txt
    while read -r mod; do
      go mod edit -replace "$mod=$mod@$staging"
    done <staging.txt
    go mod edit -require "k8s.io/kubernetes@$KUBERNETES_VERSION"
    go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/kubectl@$KUBERNETES_VERSION"
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
    go build -trimpath -ldflags "$ldflags" -o "$apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
    go build -trimpath -ldflags "$ldflags" -o "$kubectl.tmp" k8s.io/kubernetes/cmd/kubectl
  ) >"$logf" 2>&1 || fail kube-apiserver "$logf"
  mv "$apiserver.tmp" "$apiserver"
  mv "$kubectl.tmp" "$kubectl"
  rm -rf "$work"
}

build_kueue() {
  local out=$BIN_DIR/kueue-$KUEUE_VERSION
  [[ -x $out ]] && { log "kueue $KUEUE_VERSION cached"; return; }
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/build-kueue.log
  log "building kueue manager $KUEUE_VERSION (log: $logf)"
  (
    cd "$work"
    GOBIN=$work go install -trimpath -ldflags '-s -w' "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  ) >"$logf" 2>&1 || fail kueue "$logf"
  mv "$work/kueue" "$out"
  rm -rf "$work"
}

# The LeaderWorkerSet controller, at the version Kueue's go.mod requires (its leaderworkerset
# integration is built against that API). Wrapped too: the module proxy here serves the version
# but not the module's version list, which `go install pkg@version` asks for.
build_lws() { build_wrapped lws "$LWS_VERSION" sigs.k8s.io/lws sigs.k8s.io/lws/cmd; }

build_versitygw() {
  build_wrapped versitygw "$VERSITYGW_VERSION" github.com/versity/versitygw github.com/versity/versitygw/cmd/versitygw
}

build_helm() {
  local out=$BIN_DIR/helm-$HELM_VERSION
  [[ -x $out ]] && { log "helm $HELM_VERSION cached"; return; }
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/build-helm.log
  log "building helm $HELM_VERSION (log: $logf)"
  (
    cd "$work"
    GOBIN=$work go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  ) >"$logf" 2>&1 || fail helm "$logf"
  mv "$work/helm" "$out"
  rm -rf "$work"
}

# kubelet, kube-scheduler and kube-controller-manager (same wrapper module as the apiserver, one
# `go build` so they share the compile). The control plane runs the controller-manager (its
# workload controllers make the Pods of Deployments, StatefulSets and LeaderWorkerSets).
build_components() {
  local k8s_bins=(kubelet kube-scheduler kube-controller-manager) missing=0 b
  for b in "${k8s_bins[@]}"; do [[ -x $BIN_DIR/$b-$KUBERNETES_VERSION ]] || missing=1; done
  if ((missing)); then
    local work; work=$(mktemp -d)
    local logf=$CACHE_DIR/build-node.log
    local staging=v0.${KUBERNETES_VERSION#v1.}
    log "building kubelet, kube-scheduler, kube-controller-manager $KUBERNETES_VERSION (log: $logf)"
    (
      cd "$work"
      go mod init sovereignspec.local/node-build
      modfile=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
      grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$modfile" | awk '{print $1}' | sort -u >staging.txt
      while read -r mod; do go mod edit -replace "$mod=$mod@$staging"; done <staging.txt
      go mod edit -require "k8s.io/kubernetes@$KUBERNETES_VERSION"
      go get "k8s.io/kubernetes/cmd/kubelet@$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION"
      ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
      mkdir out
      go build -trimpath -ldflags "$ldflags" -o out/ k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kube-controller-manager
      for b in "${k8s_bins[@]}"; do mv "out/$b" "$BIN_DIR/$b-$KUBERNETES_VERSION"; done
    ) >"$logf" 2>&1 || fail kubelet "$logf"
    rm -rf "$work"
  else
    log "kubelet/kube-scheduler/kube-controller-manager $KUBERNETES_VERSION cached"
  fi
}

# The node: the components above, containerd 2.x (kubelet 1.36 refuses 1.x, which is all Debian
# ships) and the pause binary that every Pod sandbox runs.
build_node() {
  build_components

  if [[ -x $BIN_DIR/containerd-$CONTAINERD_VERSION && -x $BIN_DIR/containerd-shim-runc-v2-$CONTAINERD_VERSION && -x $BIN_DIR/ctr-$CONTAINERD_VERSION ]]; then
    log "containerd $CONTAINERD_VERSION cached"
  else
    local work; work=$(mktemp -d)
    local logf=$CACHE_DIR/build-containerd.log
    log "building containerd $CONTAINERD_VERSION (log: $logf)"
    (
      cd "$work"
      go mod init sovereignspec.local/containerd-build
      go get "github.com/containerd/containerd/v2@$CONTAINERD_VERSION"
      mkdir out
      CGO_ENABLED=0 go build -trimpath -tags no_btrfs -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        -o out/ github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
        github.com/containerd/containerd/v2/cmd/ctr
      for b in containerd containerd-shim-runc-v2 ctr; do mv "out/$b" "$BIN_DIR/$b-$CONTAINERD_VERSION"; done
    ) >"$logf" 2>&1 || fail containerd "$logf"
    rm -rf "$work"
  fi

  local pause=$BIN_DIR/pause-$KUBERNETES_VERSION
  if [[ -x $pause ]]; then
    log "pause ($KUBERNETES_VERSION) cached"
  else
    local dir
    dir=$(cd /tmp && GOFLAGS= go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
    gcc -Os -static -DVERSION="v$PAUSE_VERSION" -o "$pause.tmp" "$dir/build/pause/linux/pause.c" || fail pause /dev/null
    mv "$pause.tmp" "$pause"
  fi
  build_cni
}

# The pod network's CNI plugins (bridge, host-local, loopback) from their Go module, into a folder
# of their own that containerd's CRI plugin is pointed at (bin_dirs).
build_cni() {
  local dir=$BIN_DIR/cni-$CNI_PLUGINS_VERSION
  if [[ -x $dir/bridge && -x $dir/host-local && -x $dir/loopback ]]; then
    log "CNI plugins $CNI_PLUGINS_VERSION cached"
    return
  fi
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/build-cni.log
  log "building CNI plugins $CNI_PLUGINS_VERSION (log: $logf)"
  (
    cd "$work"
    go mod init sovereignspec.local/cni-build
    go get "github.com/containernetworking/plugins@$CNI_PLUGINS_VERSION"
    mkdir out
    CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o out/ \
      github.com/containernetworking/plugins/plugins/main/bridge \
      github.com/containernetworking/plugins/plugins/main/loopback \
      github.com/containernetworking/plugins/plugins/ipam/host-local
    mkdir -p "$dir.tmp" && mv out/* "$dir.tmp/" && rm -rf "$dir" && mv "$dir.tmp" "$dir"
  ) >"$logf" 2>&1 || fail cni "$logf"
  rm -rf "$work"
}

# Debian's prometheus package, extracted into the cache (no system install, no service started).
fetch_prometheus() {
  local existing
  existing=$(ls "$BIN_DIR"/prometheus-[0-9]* 2>/dev/null | head -n1 || true)
  [[ -n $existing && -x $existing ]] && { log "prometheus cached ($(basename "$existing"))"; return; }
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/fetch-prometheus.log
  log "fetching Debian's $PROMETHEUS_DEB package (log: $logf)"
  (
    cd "$work"
    apt-get download "$PROMETHEUS_DEB" || { apt-get update && apt-get download "$PROMETHEUS_DEB"; }
    deb=$(ls ./*.deb)
    version=$(dpkg-deb -f "$deb" Version | tr '+~:' '___')
    dpkg-deb -x "$deb" root
    install -m 0755 root/usr/bin/prometheus "$BIN_DIR/prometheus-$version"
  ) >"$logf" 2>&1 || fail prometheus "$logf"
  rm -rf "$work"
}

# Prometheus with Kubernetes service discovery (Debian's has none), from its Go module, with every
# other discovery left out by Prometheus's own build tags.
build_prometheus_sd() {
  local out=$BIN_DIR/prometheus-kubernetes-sd-$PROMETHEUS_SD_VERSION
  [[ -x $out ]] && { log "prometheus (kubernetes SD) $PROMETHEUS_SD_VERSION cached"; return; }
  local work; work=$(mktemp -d)
  local logf=$CACHE_DIR/build-prometheus-sd.log
  log "building prometheus $PROMETHEUS_SD_VERSION with kubernetes SD (log: $logf)"
  (
    cd "$work"
    go mod init sovereignspec.local/prometheus-build
    go get "github.com/prometheus/prometheus@$PROMETHEUS_SD_VERSION"
    go build -trimpath -ldflags '-s -w' -tags remove_all_sd,enable_kubernetes_sd -o "$out.tmp" \
      github.com/prometheus/prometheus/cmd/prometheus
  ) >"$logf" 2>&1 || fail prometheus-sd "$logf"
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

# The LeaderWorkerSet module's directory: its CRDs, RBAC and webhooks (never copied here either).
lws_dir() {
  (cd /tmp && GOFLAGS= go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
}

# The Kueue module's own CRDs (never copied into this repository).
kueue_crd_dir() {
  local dir
  dir=$(cd /tmp && GOFLAGS= go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  echo "$dir/config/components/crd/bases"
}

case ${1:-all} in
  all) build_etcd; build_kubernetes; build_components; build_kueue; build_lws; build_helm; build_versitygw; fetch_prometheus ;;
  node) build_node ;;
  cni) build_cni ;;
  components) build_components ;;
  helm) build_helm ;;
  prometheus) fetch_prometheus ;;
  prometheus-sd) build_prometheus_sd ;;
  etcd) build_etcd ;;
  kubernetes) build_kubernetes ;;
  kueue) build_kueue ;;
  lws) build_lws ;;
  versitygw) build_versitygw ;;
  crd-dir) kueue_crd_dir ;;
  lws-dir) lws_dir ;;
  *) echo "usage: $0 [all|node|components|etcd|kubernetes|kueue|lws|versitygw|helm|prometheus|prometheus-sd|crd-dir|lws-dir]" >&2; exit 2 ;;
esac
