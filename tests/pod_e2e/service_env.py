"""Helm post-renderer for the pod end-to-end test: where the operator's Pods find the API server.

The node runs no kube-proxy, so the `kubernetes` Service's cluster IP, which the kubelet puts in
KUBERNETES_SERVICE_HOST/PORT, leads nowhere. This sets those two variables to the API server's own
address on the pod network (its bridge's address, SOVEREIGNSPEC_POD_GATEWAY) and port: what
kube-proxy would have forwarded to. Nothing else changes: the chart's own rendering, defaults
included (two replicas, each on its own Pod address, probes, secure metrics).
"""

import os
import sys

import yaml

docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
for doc in docs:
    if doc.get("kind") != "Deployment":
        continue
    for c in doc["spec"]["template"]["spec"]["containers"]:
        env = [e for e in c.get("env", []) if not e["name"].startswith("KUBERNETES_SERVICE_")]
        env += [
            {"name": "KUBERNETES_SERVICE_HOST", "value": os.environ["SOVEREIGNSPEC_POD_GATEWAY"]},
            {"name": "KUBERNETES_SERVICE_PORT", "value": os.environ["E2E_APISERVER_PORT"]},
        ]
        c["env"] = env
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
