#!/usr/bin/env bash
# Run a command (make pod-e2e: the pod end-to-end tests) inside a network namespace of its own, where
# the node's pod network lives: loopback, and a bridge that the CNI bridge plugin attaches each Pod
# to, with the gateway address the Pods reach the API server and Prometheus on. Nothing is added
# to the machine's own interfaces; deleting the namespace at the end removes the bridge and every
# Pod's link with it.
#
#   netns.sh COMMAND...
#
# The command runs with:
#   SOVEREIGNSPEC_POD_GATEWAY   the bridge's address (the API servers also listen there)
#   SOVEREIGNSPEC_POD_SUBNET    the Pods' subnet, SOVEREIGNSPEC_POD_RANGE the range they get
#   SOVEREIGNSPEC_HOST_NETNS    the machine's own namespace, for the steps that need the package
#                               registries (building images, installing the engine): nsenter --net
#
# nsenter enters the network namespace only: `ip netns exec` would also remount /sys, and with it
# the cgroup hierarchies the kubelet and runc need.
set -euo pipefail
NAME=${SOVEREIGNSPEC_NETNS:-sovereignspec-pod-e2e}
GATEWAY=10.88.0.1
SUBNET=10.88.0.0/16
RANGE=10.88.1.2-10.88.1.250

log() { printf '[netns] %s\n' "$*" >&2; }
(($# > 0)) || { echo "usage: $0 COMMAND..." >&2; exit 2; }

# One left by a run that was killed: its Pods' links and the bridge go with it.
ip netns del "$NAME" 2>/dev/null || true
ip netns add "$NAME"
cleanup() { ip netns del "$NAME" 2>/dev/null || true; }
trap cleanup EXIT
in_ns() { nsenter --net="/run/netns/$NAME" -- "$@"; }
in_ns ip link set lo up
in_ns ip link add cni0 type bridge
in_ns ip addr add "$GATEWAY/${SUBNET#*/}" dev cni0
in_ns ip link set cni0 up
log "network namespace $NAME: lo, cni0 $GATEWAY/${SUBNET#*/} (Pods: $RANGE)"

rc=0
SOVEREIGNSPEC_POD_GATEWAY=$GATEWAY SOVEREIGNSPEC_POD_SUBNET=$SUBNET SOVEREIGNSPEC_POD_RANGE=$RANGE \
  SOVEREIGNSPEC_HOST_NETNS=/proc/$$/ns/net in_ns "$@" || rc=$?
exit $rc
