"""What a Workload says, read by the kind of object Kueue made it for: its owner (a Job, a
StatefulSet, a LeaderWorkerSet, a Pod), where its user's keys are, the GPUs and pods it asks for,
and the nodes Kueue's Topology Aware Scheduling assigned it. Plain dicts in, plain data out: no
I/O. Each kind's reading lives here (see docs/serving-shapes.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from fractions import Fraction
from typing import Any

from sovereignspec.operator.border import kinds

GPU_RESOURCE = "nvidia.com/gpu"
# What a check entry's or an AdmissionCheck condition's message holds, and an Event's: decisions
# shorten to them, the writer cuts to them, and what is read back is compared as written.
MESSAGE_LIMIT = 1024
EVENT_LIMIT = 1000

_QUANTITY_RE = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?[0-9]+))?", re.ASCII
)

_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


# What the caches keep of a pod template's scheduling constraints (operator/runtime/informer.py), and the
# key under which a constraint past its bound is named instead of kept: the workload is then
# Rejected naming the field (`node_pool`), never held whole. Kubernetes bounds each label key and
# value; these bound the count, whatever a tenant's template carries.
MAX_SELECTOR_ENTRIES = 64  # nodeSelector entries
MAX_TOLERATIONS = 64
MAX_AFFINITY_TERMS = 16  # required node affinity: nodeSelectorTerms
MAX_AFFINITY_RULES = 64  # required node affinity: requirements over all terms
MAX_AFFINITY_VALUES = 256  # required node affinity: values over all requirements
MAX_CONTAINERS = 64
BEYOND_BOUNDS = "\x00beyond-bounds"


class UnreadableFieldError(ValueError):
    """A field of an API object that cannot be read; the message names the field and the value."""


def parse_quantity(text: object) -> Fraction:
    """A Kubernetes resource quantity (`2`, `1k`, `500m`, `1Gi`, `1e3`), exactly."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise UnreadableFieldError(f"got {text!r}; accepted: a Kubernetes quantity such as 1, 2, 1k")
    s = str(text)
    m = _QUANTITY_RE.fullmatch(s)
    if m is None or len(s) > 64:
        raise UnreadableFieldError(f"got {s!r}; accepted: a Kubernetes quantity such as 1, 2, 1k")
    sign, number, suffix, exponent = m.groups()
    value = Fraction(number)
    if exponent is not None:
        if abs(int(exponent)) > 30:
            raise UnreadableFieldError(f"got {s!r}; exponent out of range")
        value *= Fraction(10) ** int(exponent)
    else:
        value *= _SUFFIX[suffix or ""]
    return -value if sign == "-" else value


def gpu_quantity(value: object, where: str) -> int:
    """A GPU count: a whole, non-negative quantity (extended resources cannot be split)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)  # the common case, "1" or "8", without the general parser
    try:
        q = parse_quantity(value)
    except UnreadableFieldError as exc:
        raise UnreadableFieldError(f"{where}: {exc}") from None
    if q < 0 or q.denominator != 1:
        raise UnreadableFieldError(f"{where}: got {value!r}; accepted: a whole number of GPUs")
    return int(q)


def condition(obj: Mapping[str, Any], kind: str) -> bool:
    status = obj.get("status") or {}
    return any(
        isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def name_of(obj: Mapping[str, Any]) -> str:
    """metadata.name (a KeyError where it has none: the API server always sets it)."""
    return str(obj["metadata"]["name"])


def namespace_of(obj: Mapping[str, Any], default: str | None = None) -> str:
    """Its namespace; without `default`, a KeyError where it has none (a Workload always has one:
    its absence is an object that cannot be read, and fails alone)."""
    meta = obj["metadata"]
    return str(meta["namespace"] if default is None else meta.get("namespace", default))


def named(obj: object) -> bool:
    """Whether `obj` is an object whose metadata.name can be read (what a check entry needs)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return isinstance(meta, Mapping) and "name" in meta


def active(wl: Mapping[str, Any]) -> bool:
    """spec.active: Kueue's default is true; false holds the workload out of admission."""
    return bool((wl.get("spec") or {}).get("active", True))


def our_entry(wl: Mapping[str, Any], checks: set[str] | frozenset[str]) -> dict[str, Any] | None:
    for entry in (wl.get("status") or {}).get("admissionChecks") or []:
        if isinstance(entry, dict) and entry.get("name") in checks:
            return dict(entry)
    return None


# Owners whose Workload carries no pod metadata: the keys are read from the owner (every tick).
KEYS_ON_OWNER = tuple(k.name for k in kinds.KINDS if k.keys_on_owner)


def owner_of(wl: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of the object Kueue made `wl` for (`kinds.KINDS`, in their order: Kueue also
    lists a group's Pods as owners of its Workload); ("Workload", its name) for any other."""
    refs = [r for r in wl["metadata"].get("ownerReferences") or [] if isinstance(r, dict)]
    for kind in kinds.KINDS:
        for ref in refs:
            if ref.get("kind") == kind.name:
                return kind.name, str(ref.get("name", ""))
    return kinds.WORKLOAD, str(wl["metadata"]["name"])


def owner_key(wl: Mapping[str, Any], default_namespace: str | None = None) -> tuple[str, str, str]:
    """(namespace, kind, name) of `wl`'s owner: how `World.owners` keys what it keeps of it."""
    return (namespace_of(wl, default_namespace), *owner_of(wl))


def owner_metadata(obj: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """What `World.owners` keeps of an owner (as its informer cut it): its own "annotations" and
    "labels", and for a StatefulSet its pod template's ("template_annotations", "template_labels")."""
    meta = obj.get("metadata") or {}
    out = {
        "annotations": dict(meta.get("annotations") or {}),
        "labels": dict(meta.get("labels") or {}),
    }
    tpl = ((obj.get("spec") or {}).get("template") or {}).get("metadata")
    if isinstance(tpl, dict):
        out["template_annotations"] = dict(tpl.get("annotations") or {})
        out["template_labels"] = dict(tpl.get("labels") or {})
    return out


def job_name(wl: Mapping[str, Any]) -> str:
    """What the engines' metrics are joined on: the Job's name (its pods' `job_name`), the
    Workload's own for a group's pods (Kueue's prebuilt-workload name, relabelled `workload`), the
    Pod's for a Pod admitted alone (`pod`)."""
    kind, name = owner_of(wl)
    found = kinds.BY_NAME.get(kind)
    return str(wl["metadata"]["name"]) if found is not None and found.group_of_pods else name


def container_gpus(spec: Mapping[str, Any], where: str) -> int:
    total = 0
    for i, c in enumerate(spec.get("containers") or []):
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            value = (res.get(kind) or {}).get(GPU_RESOURCE)
            if value is not None:
                total += gpu_quantity(value, f"{where}.containers[{i}].resources.{kind}[{GPU_RESOURCE}]")
                break
    return total


def requested_gpus(wl: Mapping[str, Any]) -> int:
    """GPUs the whole workload needs (every pod lands on the one node we choose)."""
    total = 0
    for n, ps in enumerate(wl.get("spec", {}).get("podSets") or []):
        where = f"spec.podSets[{n}].template.spec"
        per_pod = container_gpus((ps.get("template") or {}).get("spec") or {}, where)
        count = ps.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UnreadableFieldError(f"spec.podSets[{n}].count: got {count!r}; accepted: an integer >= 0")
        total += per_pod * count
    return total


def requested_pods(wl: Mapping[str, Any]) -> int:
    """The workload's pods when every one asks for the same GPUs (then they may be spread over
    nodes, one by one); 1 when they differ (all of them then go to one node, as one request).
    Read after `requested_gpus`, which refuses an unreadable count."""
    sizes, total = set(), 0
    for n, ps in enumerate(wl.get("spec", {}).get("podSets") or []):
        count = ps.get("count", 1)
        if count:
            sizes.add(
                container_gpus(
                    (ps.get("template") or {}).get("spec") or {}, f"spec.podSets[{n}].template.spec"
                )
            )
            total += count
    return total if len(sizes) == 1 and 0 not in sizes and total > 1 else 1


def pod_set_counts(wl: Mapping[str, Any]) -> tuple[int, ...]:
    """Pods per pod set with pods, in order (read after `requested_gpus`, which refuses a bad count)."""
    return tuple(
        int(ps.get("count", 1))
        for ps in (wl.get("spec") or {}).get("podSets") or []
        if isinstance(ps, dict) and ps.get("count", 1)
    )


def parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def declared_metadata(
    wl: Mapping[str, Any], owner: Mapping[str, Mapping[str, str]] | None, kind: str | None = None
) -> tuple[list[tuple[str, Mapping[str, Any], Mapping[str, Any]]], dict[str, Any]]:
    """Where a user's keys are read: per pod set (name, annotations, labels), and the annotations
    where they are misplaced.

    A Job's Workload carries its pod template, keys and all; a LeaderWorkerSet group's carries
    one per pod set (its leader's and its workers'), and every one of them is read: each pod runs
    what its own template says. A Pod's Workload carries its spec only (Kueue copies no pod
    metadata into it), so the keys are read from the Pod itself, which is the template its
    controller stamped out; a StatefulSet's likewise, so they are read from the StatefulSet's pod
    template. The owner's own annotations (the Job's, the StatefulSet's, the LeaderWorkerSet's, a
    replica's Deployment's: "owner_annotations" of the Pod's entry) are where keys are misplaced."""
    meta = wl["metadata"]
    own = dict(meta.get("annotations") or {})
    registered = kinds.BY_NAME.get(kind or owner_of(wl)[0])
    where = registered.keys if registered is not None else "pod-sets"
    found = owner or {}
    first = pod_set_names(wl)[:1] or ["main"]
    if where == "owner":  # a Deployment's replica: its Deployment's own annotations are misplaced too
        misplaced = {**own, **(found.get("owner_annotations") or {})}
        return [(first[0], found.get("annotations") or {}, found.get("labels") or {})], misplaced
    if where == "owner-template":
        misplaced = {**own, **(found.get("annotations") or {})}
        notes = found.get("template_annotations") or {}
        return [(first[0], notes, found.get("template_labels") or {})], misplaced
    sets = []
    for n, ps in enumerate((wl.get("spec") or {}).get("podSets") or []):
        tpl_meta = ((ps.get("template") or {}).get("metadata") or {}) if isinstance(ps, dict) else {}
        name = str(ps.get("name", n)) if isinstance(ps, dict) else str(n)
        sets.append((name, tpl_meta.get("annotations") or {}, tpl_meta.get("labels") or {}))
    job = found.get("annotations") or {}
    return sets or [(first[0], {}, {})], {**own, **job}


def pod_set_names(wl: Mapping[str, Any]) -> list[str]:
    return [
        str(ps.get("name", "")) for ps in (wl.get("spec") or {}).get("podSets") or [] if isinstance(ps, dict)
    ]


def pod_set_sizes(wl: Mapping[str, Any]) -> list[int]:
    """Pods per pod set, every pod set in order (0 for one that cannot be read): read after
    `requested_gpus`, which refuses an unreadable count."""
    spec = wl.get("spec")
    sets = (spec.get("podSets") if isinstance(spec, dict) else None) or []
    return [int(ps.get("count", 1)) if isinstance(ps, dict) else 0 for ps in sets]


def owner_missing(
    wl: Mapping[str, Any], owner: Mapping[str, Mapping[str, str]] | None
) -> tuple[str, str] | None:
    """(kind, name) of an owner whose metadata the decision needs and the caches do not hold yet:
    the object Kueue made the Workload for, or a replica's Deployment. Deciding without it would
    read no keys (a Pod's, a StatefulSet's) or miss misplaced ones: fail open. None: nothing missing."""
    kind, name = owner_of(wl)
    if kind == kinds.WORKLOAD:
        return None
    if owner is None:
        return kind, name
    parent = kinds.DEPLOYMENT.name
    deployment = (owner.get("missing") or {}).get(parent)
    return (parent, deployment) if deployment else None


def deployment_of(pod: Mapping[str, Any]) -> str | None:
    """The Deployment a Pod belongs to: its ReplicaSet owner's name less the pod-template-hash the
    Deployment controller appends (`<deployment>-<hash>`, the hash also the Pod's label)."""
    meta = pod.get("metadata") or {}
    digest = (meta.get("labels") or {}).get("pod-template-hash")
    for ref in meta.get("ownerReferences") or []:
        name = str(ref.get("name", "")) if isinstance(ref, dict) else ""
        if ref.get("kind") == kinds.REPLICASET and digest and name.endswith(f"-{digest}"):
            return name[: -len(digest) - 1]
    return None


def labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
