"""Adapt Kueue's own manifests (from the Go module cache) to a Kueue manager running out of cluster,
and the LeaderWorkerSet controller's likewise.

- RBAC: Kueue's ClusterRole `manager-role` and its namespaced Roles, bound to the user
  `kueue-manager` (the manager's client certificate): the permissions its own manifests give it.
  LWS's `manager-role`, bound to `lws-controller`.
- Webhooks: the Mutating/ValidatingWebhookConfigurations for the API groups this harness enables
  (kueue.x-k8s.io, batch, pods, apps, leaderworkerset.x-k8s.io), pointed at https://127.0.0.1:<port>
  with our CA instead of a Service, with the namespaceSelector (Kueue) and objectSelector (LWS)
  that each project's kustomization adds.

Nothing is copied into the repository; the output goes to the cluster's state directory.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import yaml

# Kueue's integrations this harness enables: batch/job, pod, deployment, statefulset and
# leaderworkerset.x-k8s.io/leaderworkerset ("" is the core group: Pods).
ENABLED_GROUPS = {"kueue.x-k8s.io", "batch", "", "apps", "leaderworkerset.x-k8s.io"}


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


def kueue_namespace_selectors(kueue: Path) -> dict[str, dict]:
    """Kueue's kustomization: the pod webhook's namespaceSelector (kube-system and kueue-system left
    alone), copied by its `replacements` to every workload webhook. Hook name -> selector."""
    kust = yaml.safe_load((kueue / "config/components/webhook/kustomization.yaml").read_text())
    source: dict[str, dict] = {}
    for patch in kust.get("patches", []):
        for hook in yaml.safe_load(patch["patch"]).get("webhooks", []):
            if "namespaceSelector" in hook:
                source[hook["name"]] = hook["namespaceSelector"]
    out = dict(source)
    for replacement in kust.get("replacements", []):
        name = replacement["source"]["fieldPath"].split("[name=", 1)[1].split("]", 1)[0]
        for target in replacement.get("targets", []):
            for path in target.get("fieldPaths", []):
                out[path.split("[name=", 1)[1].split("]", 1)[0]] = source[name]
    return out


def lws_object_selectors(lws: Path) -> dict[str, dict]:
    """LWS's kustomization: its pod webhooks see only the pods of a LeaderWorkerSet."""
    out = {}
    for name in ("mutating-patch.yaml", "validating-patch.yaml"):
        for op in yaml.safe_load((lws / "config/webhook" / name).read_text()):
            value = op.get("value") or {}
            if "objectSelector" in value:
                out[value["name"]] = value["objectSelector"]
    return out


def webhooks(
    manifests: Path, url: str, ca: bytes, prefix: str = "kueue-", selectors: dict[str, dict] | None = None
) -> list[dict]:
    out = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = prefix + doc["metadata"]["name"]
        kept = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups or not groups <= ENABLED_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url.rstrip("/") + path, "caBundle": base64.b64encode(ca).decode()}
            for key, by_name in (selectors or {}).items():
                if hook["name"] in by_name:
                    hook[key] = by_name[hook["name"]]
            kept.append(hook)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def lws_rbac(lws: Path, user: str) -> list[dict]:
    """LWS's ClusterRole `manager-role`, bound to `user` (leader election is off here)."""
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    (role,) = [d for d in yaml.safe_load_all((lws / "config/rbac/role.yaml").read_text()) if d]
    role["metadata"] = {"name": "lws-" + role["metadata"]["name"]}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": role["metadata"],
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [subject],
    }
    return [role, binding]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kueue-dir", type=Path, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--webhook-url", required=True)
    parser.add_argument("--user", default="kueue-manager")
    parser.add_argument("--namespace", default="kueue-system")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lws-dir", type=Path, default=None)
    parser.add_argument("--lws-webhook-url", default=None)
    parser.add_argument("--lws-user", default="lws-controller")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kueue-rbac.yaml").write_text(
        yaml.safe_dump_all(rbac(args.kueue_dir, args.user, args.namespace))
    )
    ca = args.ca.read_bytes()
    manifests = args.kueue_dir / "config/components/webhook/manifests.yaml"
    selectors = {"namespaceSelector": kueue_namespace_selectors(args.kueue_dir)}
    docs = webhooks(manifests, args.webhook_url, ca, "kueue-", selectors)
    (args.out / "kueue-webhooks.yaml").write_text(yaml.safe_dump_all(docs))
    if args.lws_dir is not None:
        (args.out / "lws-rbac.yaml").write_text(yaml.safe_dump_all(lws_rbac(args.lws_dir, args.lws_user)))
        lws_hooks = webhooks(
            args.lws_dir / "config/webhook/manifests.yaml",
            args.lws_webhook_url,
            ca,
            "lws-",
            {"objectSelector": lws_object_selectors(args.lws_dir)},
        )
        (args.out / "lws-webhooks.yaml").write_text(yaml.safe_dump_all(lws_hooks))


if __name__ == "__main__":
    main()
