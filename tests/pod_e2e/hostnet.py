"""Helm post-renderer for the pod end-to-end test: the operator's Pod on the host's network.

This machine may create no pod network and runs no kube-proxy, so a Pod reaches the API server
and Prometheus only on the host's loopback: hostNetwork, the DNS policy that goes with it, and the
API server's address in KUBERNETES_SERVICE_HOST/PORT (what the kubelet would set from the
`kubernetes` Service). Everything else is the chart's own rendering, defaults included.

On the host's network the chart's two replicas, on the one node, would both bind the metrics and
liveness ports (the scheduler refuses the second for its host ports): with more than one replica,
the controller serves neither (port 0) and has neither ports nor probes. Its image's liveness
endpoint is then not probed here (the cluster tests probe it, tests/cluster/test_token_auth.py).
"""

import os
import sys

import yaml

docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
for doc in docs:
    if doc.get("kind") != "Deployment":
        continue
    pod = doc["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    for c in pod["containers"]:
        if doc["spec"].get("replicas", 1) > 1:
            for key in ("ports", "livenessProbe", "readinessProbe"):
                c.pop(key, None)
            c["args"] = [
                f"{a.split('=', 1)[0]}=0" if a.startswith(("--metrics-port=", "--liveness-port=")) else a
                for a in c["args"]
            ]
        env = [e for e in c.get("env", []) if not e["name"].startswith("KUBERNETES_SERVICE_")]
        env += [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": os.environ["E2E_APISERVER_PORT"]},
        ]
        c["env"] = env
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
