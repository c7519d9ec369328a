#!/usr/bin/env bash
# Stop exactly the processes cluster-up.sh started (by recorded PID, checked against their binary),
# remove the state directory, and check that nothing is left listening on our ports.
set -uo pipefail
source "$(dirname "$0")/cluster-lib.sh"

stopped=0
for name in kube-controller-manager kueue lws kube-apiserver etcd; do # the reverse of cluster-up's order
  if alive "$name"; then
    pid=$(pid_of "$name")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored SIGTERM for 5 s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    log "stopped $name (pid $pid)"
    stopped=$((stopped + 1))
  fi
done

if [[ -f $STATE_DIR/created-kueue-metrics-certs ]]; then
  created=$(cat "$STATE_DIR/created-kueue-metrics-certs")
  [[ $created == /etc/kueue* ]] && rm -rf "$created"
fi
rm -rf "$STATE_DIR"

busy=()
for port in "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KUEUE_HEALTH_PORT" "$KUEUE_METRICS_PORT" "$KUEUE_WEBHOOK_PORT" \
  "$LWS_HEALTH_PORT" "$LWS_METRICS_PORT" "$LWS_WEBHOOK_PORT"; do
  port_in_use "$port" && busy+=("$port")
done
if ((${#busy[@]})); then
  log "still listening after cluster-down: ${busy[*]} (not ours, or a process that would not stop)"
  exit 1
fi
log "down: stopped $stopped processes, removed $STATE_DIR"
