"""Adapt Kueue's own manifests (from the Go module cache) to a Kueue manager running out of cluster.

- RBAC: Kueue's ClusterRole `manager-role` and its namespaced Roles, bound to the user
  `kueue-manager` (the manager's client certificate): the permissions its own manifests give it.
- Webhooks: the Mutating/ValidatingWebhookConfigurations for the API groups this harness enables
  (kueue.x-k8s.io and batch), pointed at https://127.0.0.1:<port> with our CA instead of a Service.

Nothing is copied into the repository; the output goes to the cluster's state directory.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import yaml

ENABLED_GROUPS = {"kueue.x-k8s.io", "batch"}


def rbac(kueue: Path, user: str, namespace: str) -> list[dict]:
    """The manager's ClusterRole and its namespaced Roles (secrets, cluster profiles), bound to `user`."""
    base = kueue / "config/components/rbac"
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    out: list[dict] = []
    for name in ("role.yaml", "manager_secrets_role.yaml", "manager_clusterprofiles_role.yaml"):
        for doc in yaml.safe_load_all((base / name).read_text()):
            if not doc or doc.get("kind") not in {"ClusterRole", "Role"}:
                continue
            kind = doc["kind"]
            meta = {"name": "kueue-" + doc["metadata"]["name"]}
            if kind == "Role":
                meta["namespace"] = namespace
            doc["metadata"] = meta
            out.append(doc)
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": kind + "Binding",
                    "metadata": meta,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": meta["name"]},
                    "subjects": [subject],
                }
            )
    return out


def webhooks(kueue: Path, url: str, ca: bytes) -> list[dict]:
    out = []
    for doc in yaml.safe_load_all((kueue / "config/components/webhook/manifests.yaml").read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        kept = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups or not groups <= ENABLED_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url.rstrip("/") + path, "caBundle": base64.b64encode(ca).decode()}
            kept.append(hook)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kueue-dir", type=Path, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--webhook-url", required=True)
    parser.add_argument("--user", default="kueue-manager")
    parser.add_argument("--namespace", default="kueue-system")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kueue-rbac.yaml").write_text(
        yaml.safe_dump_all(rbac(args.kueue_dir, args.user, args.namespace))
    )
    docs = webhooks(args.kueue_dir, args.webhook_url, args.ca.read_bytes())
    (args.out / "kueue-webhooks.yaml").write_text(yaml.safe_dump_all(docs))


if __name__ == "__main__":
    main()
