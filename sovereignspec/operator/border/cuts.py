"""What the watch-fed caches keep of each object: only what decisions read, within stated bounds,
so the operator's memory grows with the number of objects and not with what tenants' templates
carry (an object past a bound is kept as a named refusal, never whole).
"""

from __future__ import annotations

import sys
from typing import Any

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border import kinds
from sovereignspec.operator.border import workloads as wls
from sovereignspec.operator.border.objects import last_finish

Obj = dict[str, Any]


def compact(value: Any) -> Any:
    """The same JSON value with its keys and short strings interned: each watch event is parsed on
    its own, so without this every cached object holds its own copy of "metadata",
    "lastTransitionTime", "nvidia.com/gpu"... (half a Workload's memory)."""
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= 64:
        return sys.intern(value)
    return value


def strip(obj: Obj) -> Obj:
    """Drop what no decision reads and what weighs most (managedFields); share repeated strings."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return compact(obj)


# A Workload's kept copy holds what decisions read and nothing a tenant can grow at will: of the
# annotations and labels, only our keys (the border reads no other), at most ann.MAX_OUR_KEYS of
# them, each value at most ann.MAX_OUR_VALUE bytes (a longer one is kept as ann.OVERSIZED + its
# size, which the border refuses by name); of each pod template's spec, the containers' GPUs, the
# nodeSelector, the tolerations and the required node affinity, each within a bound (past it, named
# and refused: `_slim_pod_template`); of every check's podSetUpdates, our keys.
MAX_UPDATE_VALUE = 65536  # our own decisions' values (a per-batch table) are kept up to this


def ours(notes: Any, limit: int = ann.MAX_OUR_VALUE) -> dict[str, str]:
    """Our keys of an annotation map, bounded in count and size (see MAX_OUR_KEYS)."""
    out: dict[str, str] = {}
    if not isinstance(notes, dict):
        return out
    found = sorted(k for k in notes if isinstance(k, str) and k.startswith(ann.PREFIX))
    for k in found[: ann.MAX_OUR_KEYS]:
        v = notes[k]
        text = v if isinstance(v, str) else repr(v)
        size = len(text.encode("utf-8", "surrogatepass"))
        out[k] = text if size <= limit else f"{ann.OVERSIZED}{size}"
    if len(found) > ann.MAX_OUR_KEYS:
        out[ann.TOO_MANY_KEYS] = str(len(found))
    return out


def _slim_pod_template(tpl: Any) -> Obj:
    """What decisions read of a pod template, within stated bounds (workloads.MAX_*): our keys of
    its annotations and labels (the border reads no other), each container's GPUs, the
    nodeSelector, the tolerations' matching fields and the required node affinity. A constraint
    past its bound is not kept: `BEYOND_BOUNDS` names it, and the workload is Rejected saying so."""
    if not isinstance(tpl, dict):
        return {}
    meta: Obj = tpl["metadata"] if isinstance(tpl.get("metadata"), dict) else {}
    spec: Obj = tpl["spec"] if isinstance(tpl.get("spec"), dict) else {}
    kept_spec: Obj = {}
    beyond: list[str] = []
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict) and len(selector) > wls.MAX_SELECTOR_ENTRIES:
        beyond.append(f"nodeSelector: {len(selector)} entries; accepted: at most {wls.MAX_SELECTOR_ENTRIES}")
    elif "nodeSelector" in spec:
        kept_spec["nodeSelector"] = selector
    tolerations = spec.get("tolerations")
    if isinstance(tolerations, list) and len(tolerations) > wls.MAX_TOLERATIONS:
        beyond.append(f"tolerations: {len(tolerations)}; accepted: at most {wls.MAX_TOLERATIONS}")
    elif isinstance(tolerations, list):
        kept_spec["tolerations"] = [
            {k: t[k] for k in ("key", "operator", "value", "effect") if k in t} if isinstance(t, dict) else t
            for t in tolerations
        ]
    required = _required_affinity(spec, beyond)
    if required is not None:
        kept_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    if len(containers) > wls.MAX_CONTAINERS:
        beyond.append(f"containers: {len(containers)}; accepted: at most {wls.MAX_CONTAINERS}")
        containers = []
    kept_spec["containers"] = [{"resources": _gpu_resources(c.get("resources"))} for c in containers]
    if beyond:
        kept_spec[wls.BEYOND_BOUNDS] = "; ".join(beyond)
    kept_meta: Obj = {"annotations": ours(meta.get("annotations"))}
    if isinstance(meta.get("labels"), dict):
        kept_meta["labels"] = ours(meta["labels"])  # read only to say a key of ours is misplaced
    return {"metadata": kept_meta, "spec": kept_spec}


def _gpu_resources(resources: Any) -> Obj:
    """A container's GPU requests and limits (the only resource decisions count)."""
    out: Obj = {}
    for kind in ("requests", "limits"):
        found = (resources or {}).get(kind) if isinstance(resources, dict) else None
        if isinstance(found, dict) and wls.GPU_RESOURCE in found:
            out[kind] = {wls.GPU_RESOURCE: found[wls.GPU_RESOURCE]}
    return out


def _required_affinity(spec: Obj, beyond: list[str]) -> Any:
    """The pod's required node affinity when within bounds (else named in `beyond`); None: none."""
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, dict)
        else None
    )
    if required is None:
        return None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if isinstance(terms, list):
        rules = [
            r
            for t in terms
            if isinstance(t, dict)
            for part in ("matchExpressions", "matchFields")
            for r in (t.get(part) or [])
        ]
        values = sum(len(r.get("values") or []) for r in rules if isinstance(r, dict))
        where = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        for count, bound, what in (
            (len(terms), wls.MAX_AFFINITY_TERMS, "terms"),
            (len(rules), wls.MAX_AFFINITY_RULES, "requirements"),
            (values, wls.MAX_AFFINITY_VALUES, "values"),
        ):
            if count > bound:
                beyond.append(f"{where}: {count} {what}; accepted: at most {bound}")
                return None
    return required


def strip_workload(obj: Obj) -> Obj:
    """A Workload as decisions read it, bounded whatever its pod templates carry."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta["annotations"] = ours(meta.get("annotations"))
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("podSets"), list):
        spec["podSets"] = [
            {
                **{k: v for k, v in ps.items() if k != "template"},
                "template": _slim_pod_template(ps.get("template")),
            }
            if isinstance(ps, dict)
            else ps
            for ps in spec["podSets"]
        ]
    status = obj.get("status")
    if isinstance(status, dict) and isinstance(status.get("admissionChecks"), list):
        status["admissionChecks"] = [_slim_entry(e) for e in status["admissionChecks"]]
    return strip(obj)


def _slim_entry(entry: Any) -> Any:
    """A check's entry with its podSetUpdates' annotations cut to our keys (what the ledger and
    the hand-off read of ours; another check's are not read)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("podSetUpdates"), list):
        return entry
    updates = [
        {
            **{k: u[k] for k in ("name", "nodeSelector", "tolerations", "labels") if k in u},
            "annotations": ours(u.get("annotations"), MAX_UPDATE_VALUE),
        }
        if isinstance(u, dict)
        else u
        for u in entry["podSetUpdates"]
    ]
    return {**entry, "podSetUpdates": updates}


def strip_owner(obj: Obj) -> Obj:
    """A Job's metadata: our keys of its annotations are all that is read (misplaced keys)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta["annotations"] = ours(meta.get("annotations"))
    return strip(obj)


def strip_statefulset(obj: Obj) -> Obj:
    """A StatefulSet as its Workload's keys are read: our keys of its pod template's annotations
    and labels (where they belong) and of its own annotations (where they are misplaced)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    template = (spec.get("template") if isinstance(spec, dict) else None) or {}
    tpl_meta = (template.get("metadata") if isinstance(template, dict) else None) or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return strip(
        {
            "apiVersion": obj.get("apiVersion", "apps/v1"),
            "kind": obj.get("kind", kinds.STATEFULSET.name),
            "metadata": {**kept, "annotations": ours(meta.get("annotations"))},
            "spec": {
                "template": {
                    "metadata": {
                        "annotations": ours(tpl_meta.get("annotations")),
                        "labels": ours(tpl_meta.get("labels")),
                    }
                }
            },
        }
    )


def strip_queued_pod(obj: Obj) -> Obj:
    """A queued Pod's metadata: only our keys, of its annotations (read as its template's) and of
    its labels (where they are misplaced); a tenant grows nothing else into the cache."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    labels = ours(meta.get("labels"))
    digest = (meta.get("labels") or {}).get("pod-template-hash")
    if isinstance(digest, str) and len(digest) <= 63:  # which Deployment: see workloads.deployment_of
        labels["pod-template-hash"] = digest
    owners = [
        {"kind": kinds.REPLICASET, "name": str(r.get("name", ""))[:253]}
        for r in meta.get("ownerReferences") or []
        if isinstance(r, dict) and r.get("kind") == kinds.REPLICASET
    ][:1]
    return strip(
        {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", kinds.POD.name),
            "metadata": {
                **kept,
                "annotations": ours(meta.get("annotations")),
                "labels": labels,
                **({"ownerReferences": owners} if owners else {}),
            },
        }
    )


def strip_node(obj: Obj) -> Obj:
    status = obj.get("status")
    if isinstance(status, dict):
        status.pop("images", None)  # a real node lists every image it holds
    return strip(obj)


def strip_pod(obj: Obj) -> Obj:
    """Only what the ledger and the record read of a bound Pod: owner, node, GPU requests, phase,
    the Workload Kueue built for its group (a label, or an annotation under a Kueue feature gate),
    when it started and its containers' last finish (the record's binding and end)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    finished = last_finish(status)
    prebuilt = next(
        (
            m[ann.KUEUE_PREBUILT]
            for m in (meta.get("labels"), meta.get("annotations"))
            if isinstance(m, dict) and isinstance(m.get(ann.KUEUE_PREBUILT), str)
        ),
        None,
    )
    containers = [
        {"resources": c.get("resources") or {}} for c in spec.get("containers") or [] if isinstance(c, dict)
    ]
    return strip(
        {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", kinds.POD.name),
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "ownerReferences")
                if k in meta
            }
            | ({"labels": {ann.KUEUE_PREBUILT: prebuilt}} if prebuilt is not None else {}),
            "spec": {"nodeName": spec.get("nodeName"), "containers": containers},
            "status": {
                "phase": status.get("phase"),
                "startTime": status.get("startTime"),
                # the last finish alone: what an ended record names
                **(
                    {"containerStatuses": [{"state": {"terminated": {"finishedAt": finished}}}]}
                    if finished
                    else {}
                ),
            },
        }
    )
