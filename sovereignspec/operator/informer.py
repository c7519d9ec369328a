"""Watch-fed caches of the objects a tick reads: one LIST at start-up, then a WATCH from its
resourceVersion; a LIST again only when a watch cannot be resumed (410 Gone, or an error).

Why our own and not kopf's indices: a kopf re-list after a broken watch replays the objects it
finds but never drops the ones deleted in the gap, so a vanished Workload would hold its GPU in the
ledger until a restart; kopf watches without server-side field selectors or metadata-only reads
(every Pod in the cluster, whole Jobs); and the tick reads from a worker thread. kopf still runs
the process: login, start-up, liveness.

A cache must never show the ledger older than what this controller itself wrote, or the next tick
would place a second workload on a GPU it just gave away. So a write's response goes into the
cache at once (`put`), and an object in the cache is never replaced by an older resourceVersion
(a watch event that was already on its way).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.operator import annotations as ann
from sovereignspec.operator import kinds, metrics
from sovereignspec.operator import workloads as wls

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PAGE = 500  # objects per LIST page: bounds the memory of one response
ABSENT_RECHECK = 60.0  # seconds between LISTs of an optional resource the server does not serve
# Workloads and Jobs carry tenants' pod templates (up to etcd's 1.5 MB each): a page of them is
# held whole while it is read and stripped, so it is smaller.
TEMPLATE_PAGE = 50
WATCH_SECONDS = 300  # the server ends a watch after this (jittered); it is resumed from its RV


class GoneError(Exception):
    """The watch's resourceVersion is too old for the server: a LIST is needed."""


def key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def rv_int(obj: Obj | None) -> int | None:
    text = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


def newer_or_same(candidate: Obj, current: Obj | None) -> bool:
    """Whether `candidate` may replace `current` (resourceVersions compared as etcd's integers;
    one that is not an integer is taken as newer: Kubernetes calls them opaque)."""
    a, b = rv_int(candidate), rv_int(current)
    return a is None or b is None or a >= b


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
    """Only what the ledger reads of a bound Pod: owner, node, GPU requests, phase, and the
    Workload Kueue built for its group (a label, or an annotation under a Kueue feature gate)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
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
            "status": {"phase": (obj.get("status") or {}).get("phase")},
        }
    )


@dataclass
class Informer:
    """One resource's objects, kept current by a watch, readable from any thread."""

    api: client.ApiClient
    path: str
    name: str
    query: list[tuple[str, str]] = field(default_factory=list)
    accept: str = "application/json"
    watch_accept: str = "application/json"
    transform: Callable[[Obj], Obj] = strip
    wake: Callable[[str, Obj], bool] = lambda _type, _obj: False  # does this event call for a tick?
    on_wake: Callable[[], None] = lambda: None
    watch_seconds: int = WATCH_SECONDS
    page: int = PAGE
    # A resource whose API may not be served (a CRD not installed: LeaderWorkerSets): a 404 is an
    # empty cache in sync, listed again every ABSENT_RECHECK seconds, not a cache that holds
    # every decision back.
    optional: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._store: dict[str, Obj] = {}
        self._stop = threading.Event()
        self.synced = threading.Event()  # a LIST has completed and the watch is open
        self.lists = 0  # full LISTs so far: 1 at start-up, one more per watch that could not resume
        self.last_error = ""
        self.denied = False  # the last try was refused (401/403): no wait will mend that
        self.absent = False  # an optional resource whose API the server does not serve
        self._rv: str | None = None
        self._resync = threading.Event()  # list again now (catch_up), whatever the watch says
        self._thread: threading.Thread | None = None
        self._open: Any = None  # the watch response being read, to unblock it on stop

    # -- reading ---------------------------------------------------------------------------------

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def get(self, k: str) -> Obj | None:
        with self._lock:
            return self._store.get(k)

    def __len__(self) -> int:
        return len(self._store)

    def put(self, obj: Obj) -> None:
        """An object as the API server returned it to one of our writes (read-your-writes)."""
        obj = self.transform(obj)
        with self._lock:
            if newer_or_same(obj, self._store.get(key(obj))):
                self._store[key(obj)] = obj

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> Informer:
        """Start watching (again, after `stop`: from where it stopped, no LIST if it can resume)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait: float = 0.0) -> bool:
        """Stop now, applying no further event; True if the thread ended within `wait`."""
        self._stop.set()
        open_watch = self._open
        if open_watch is not None:
            open_watch.shutdown()  # unblocks the read in the informer's thread
        if self._thread is not None and wait > 0:
            self._thread.join(wait)
        return self._thread is None or not self._thread.is_alive()

    def catch_up(self, wait: float = 1.0, timeout: float = 60.0) -> bool:
        """Hold at least what the API server holds now (a new leader, before its first decision:
        the last writes of the one before may still be on their way down the watch). A LIST of one
        item is a consistent read of the collection's resourceVersion now; the watch has `wait`
        seconds to pass it, else the cache is listed again (an idle watch never passes it).
        True if it listed again."""
        raw = self._request([*self.query, ("limit", "1")], self.accept, (10, 30))
        try:
            data = raw.read()
            if raw.status >= 400:
                raise ApiException(status=raw.status, reason=data.decode(errors="replace")[:300])
        finally:
            raw.release_conn()
        target = str((json.loads(data).get("metadata") or {}).get("resourceVersion", ""))
        if not target.isdigit():
            return False  # not etcd's integers (or an absent API): nothing to compare against
        relisted = False
        deadline = time.monotonic() + timeout
        give_up_waiting = time.monotonic() + wait
        while True:
            seen = self._rv or ""
            if seen.isdigit() and int(seen) >= int(target):
                return relisted
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"cache of {self.name} did not reach resourceVersion {target}")
            if self._stop.is_set():  # the process is stopping: no watch will move it on
                raise RuntimeError(f"cache of {self.name} stopped before it reached resourceVersion {target}")
            if not relisted and now >= give_up_waiting:
                relisted = True
                self._resync.set()
                open_watch = self._open
                if open_watch is not None:
                    open_watch.shutdown()
            self._stop.wait(0.05)

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if self._resync.is_set():
                    self._resync.clear()
                    self._rv = None
                if self._rv is None:
                    self._rv = self._relist()
                if self.absent:  # nothing to watch: look again later (the CRD may come)
                    self._stop.wait(ABSENT_RECHECK)
                    self._rv = None
                    continue
                self._watch()
                backoff = 0.2  # the server closed a healthy watch: resume from its RV
            except GoneError:
                log.info("watch of %s: resourceVersion too old; listing again", self.name)
                self.synced.clear()  # no decisions from this cache until it is listed again
                self._rv = None
            except Exception as exc:
                # Whatever it is, the thread must not die: a dead informer would leave its cache
                # marked in sync and silently stale; this leaves it out of sync (no decisions)
                # until a retry succeeds.
                if self._stop.is_set():
                    break  # stopped on purpose: the read was cut short
                if self._resync.is_set():
                    continue  # cut short on purpose, to list again
                self.synced.clear()  # until the watch (or a LIST) is open again
                self.denied = isinstance(exc, ApiException) and exc.status in (401, 403)
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                metrics.WATCH_ERRORS.labels(resource=self.name).inc()
                log.warning("watch of %s failed (%s); retrying in %.1fs", self.name, self.last_error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _request(self, query: list[tuple[str, str]], accept: str, timeout: tuple[float, float]) -> Any:
        resp = self.api.call_api(
            *self.api.param_serialize(
                method="GET",
                resource_path=self.path,
                query_params=query,
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],  # a ServiceAccount token is sent only so
            ),
            _request_timeout=timeout,
        )
        return resp.response  # urllib3's response, not read yet

    def _relist(self) -> str:
        """Replace the store with a fresh LIST (in pages); returns its resourceVersion."""
        fresh: dict[str, Obj] = {}
        cont, rv = "", ""
        while True:
            query = [*self.query, ("limit", str(self.page))] + ([("continue", cont)] if cont else [])
            raw = self._request(query, self.accept, (10, 120))
            try:
                data = raw.read()
                if raw.status == 410 and cont:
                    cont = ""  # the continue token expired mid-list: start the list again
                    fresh.clear()
                    continue
                if raw.status == 404 and self.optional and not cont:
                    return self._absent()
                if raw.status >= 400:
                    raise ApiException(status=raw.status, reason=data.decode(errors="replace")[:300])
            finally:
                raw.release_conn()
            doc = json.loads(data)
            kind = str(doc.get("kind", "")).removesuffix("List")
            version = doc.get("apiVersion")
            for item in doc.get("items") or []:
                if isinstance(item, dict) and isinstance(item.get("metadata"), dict):
                    item.setdefault("kind", kind)
                    item.setdefault("apiVersion", version)
                    fresh[key(item)] = self.transform(item)
            meta = doc.get("metadata") or {}
            rv, cont = str(meta.get("resourceVersion", "")), str(meta.get("continue") or "")
            if not cont:
                break
        with self._lock:
            listed_at = int(rv) if rv.isdigit() else None
            for k, obj in self._store.items():  # our own writes that the LIST predates stay
                mine = rv_int(obj)
                newer = mine is not None and listed_at is not None and mine > listed_at
                if newer and k in fresh and newer_or_same(obj, fresh[k]):
                    fresh[k] = obj
            self._store = fresh
        self.lists += 1
        self.denied = False
        self.absent = False
        metrics.CACHE_LISTS.labels(resource=self.name).inc()
        metrics.CACHE_OBJECTS.labels(resource=self.name).set(len(fresh))
        self.synced.set()
        self.on_wake()
        return rv

    def _absent(self) -> str:
        if not self.absent:
            log.info(
                "%s: not served by this API server (its CRD is not installed): an empty cache", self.name
            )
        with self._lock:
            self._store = {}
        self.absent = True
        self.denied = False
        self.synced.set()
        return ""

    def _watch(self) -> None:
        seconds = int(self.watch_seconds * random.uniform(0.8, 1.2))
        query = [
            *self.query,
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self._rv or ""),
            ("timeoutSeconds", str(seconds)),
        ]
        raw = self._request(query, self.watch_accept, (10, seconds + 30))
        self._open = raw
        try:
            if raw.status == 410:
                raise GoneError
            if raw.status >= 400:
                raise ApiException(status=raw.status, reason=raw.read().decode(errors="replace")[:300])
            self.synced.set()
            self.denied = False
            for line in _lines(raw):
                if self._stop.is_set():
                    return
                self._event(json.loads(line))
        finally:
            self._open = None
            raw.release_conn()

    def _event(self, event: Obj) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise GoneError
            raise ValueError(f"watch error event: {str(obj.get('message', obj))[:200]}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self._rv = rv or self._rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj.get("metadata"), dict):
            return
        obj = self.transform(obj)
        k = key(obj)
        with self._lock:
            if kind == "DELETED":
                self._store.pop(k, None)
            elif newer_or_same(obj, self._store.get(k)):
                self._store[k] = obj
        self._rv = rv or self._rv
        metrics.CACHE_OBJECTS.labels(resource=self.name).set(len(self._store))
        if self.wake(str(kind), obj):
            self.on_wake()


def _lines(raw: Any) -> Iterator[bytes]:
    """Newline-delimited JSON from a chunked watch response, as each chunk arrives."""
    pending = b""
    for chunk in raw.stream(65536, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
PARTIAL = "application/json;as=PartialObjectMetadata{};g=meta.k8s.io;v=v1,application/json"
QUEUE_LABEL = ann.KUEUE_QUEUE  # what a Pod carries for Kueue's pod integration to manage it


def _has_checks(kind: str, obj: Obj) -> bool:
    return bool((obj.get("status") or {}).get("admissionChecks")) or kind == "DELETED"


class InformerSet:
    """Informers read together by one tick: started, stopped and judged in sync as one."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.on_wake: Callable[[], None] = lambda: None  # set by the decision loop
        self.all: list[Informer] = []

    def informer(self, path: str, name: str, **kw: Any) -> Informer:
        # Each watch on a client (connection pool) of its own, so that a long watch never holds a
        # connection the writes need; the configuration (and its token) is shared.
        made = Informer(client.ApiClient(self.api.configuration), path, name, on_wake=self._wake, **kw)
        self.all.append(made)
        return made

    def metadata_only(self, path: str, name: str, transform: Callable[[Obj], Obj], **kw: Any) -> Informer:
        """An informer of objects' metadata only (PartialObjectMetadata), in bounded pages."""
        return self.informer(
            path,
            name,
            accept=PARTIAL.format("List"),
            watch_accept=PARTIAL.format(""),
            transform=transform,
            page=TEMPLATE_PAGE,
            **kw,
        )

    def _wake(self) -> None:
        self.on_wake()

    def start(self) -> InformerSet:
        for i in self.all:
            i.start()
        return self

    def stop(self) -> None:
        for i in self.all:
            i.stop()

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.all)

    def denied(self) -> list[str]:
        return [f"{i.name}: {i.last_error}" for i in self.all if i.denied]

    def not_synced(self) -> list[str]:
        return [f"{i.name} ({i.last_error or 'listing'})" for i in self.all if not i.synced.is_set()]

    def lists(self) -> int:
        return sum(i.lists for i in self.all)


def always(_kind: str, _obj: Obj) -> bool:
    return True


class ClusterCache(InformerSet):
    """Every resource a worker's tick reads, each in its own watch-fed Informer."""

    def __init__(self, api: client.ApiClient, policies_path: str) -> None:
        super().__init__(api)
        informer = self.informer
        self.workloads = informer(
            f"{KUEUE}/workloads", "workloads", wake=_has_checks, transform=strip_workload, page=TEMPLATE_PAGE
        )
        self.checks = informer(f"{KUEUE}/admissionchecks", "admissionchecks", wake=always)
        self.policies = informer(policies_path, "speculationpolicies", wake=always)
        self.flavors = informer(f"{KUEUE}/resourceflavors", "resourceflavors", wake=always)
        self.nodes = informer(
            "/api/v1/nodes", "nodes", transform=strip_node, wake=lambda k, _o: k in ("ADDED", "DELETED")
        )
        self.namespaces = informer("/api/v1/namespaces", "namespaces")
        self.pods = informer(
            "/api/v1/pods",
            "pods",
            query=[("fieldSelector", "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")],
            transform=strip_pod,
        )
        # Each registered kind's owners (`kinds.KINDS`), cut as its decisions read them: a Job's
        # and a LeaderWorkerSet's metadata (to tell a user whose keys sit on the object itself);
        # the metadata of the Pods Kueue admits one by one (a plain Pod, a Deployment's replica):
        # their Workloads carry no pod metadata, so our keys are read there; a StatefulSet's pod
        # template, for the same reason (whole objects, as the template is in the spec; cut to our
        # keys as each page arrives, as the Workloads are).
        self._owners: dict[str, Informer] = {}
        for kind in kinds.KINDS:
            self._owners[kind.name] = self._owner_informer(kind)
        # Deployments' metadata: where a replica's keys may be misplaced.
        self.deployments = self.metadata_only(kinds.DEPLOYMENT.path, kinds.DEPLOYMENT.plural, strip_owner)

    def _owner_informer(self, kind: kinds.Kind) -> Informer:
        if kind.cut == "template":
            return self.informer(kind.path, kind.plural, transform=strip_statefulset, page=TEMPLATE_PAGE)
        if kind.cut == "queued-pod":
            query = [("labelSelector", QUEUE_LABEL)]
            return self.metadata_only(kind.path, "queued-pods", strip_queued_pod, query=query)
        return self.metadata_only(kind.path, kind.plural, strip_owner, optional=kind.optional)

    def owners(self, kind: kinds.Kind) -> Informer:
        """The cache of `kind`'s owner objects."""
        return self._owners[kind.name]


class DispatchCache(InformerSet):
    """What a dispatch tick reads, each resource in its own watch-fed Informer."""

    def __init__(self, api: client.ApiClient, policies_path: str) -> None:
        super().__init__(api)
        self.workloads = self.informer(
            f"{KUEUE}/workloads", "workloads", wake=_has_checks, transform=strip_workload, page=TEMPLATE_PAGE
        )
        self.checks = self.informer(f"{KUEUE}/admissionchecks", "admissionchecks", wake=always)
        self.policies = self.informer(policies_path, "speculationpolicies", wake=always)
        self.namespaces = self.informer("/api/v1/namespaces", "namespaces")
        self.clusters = self.informer(f"{KUEUE}/multikueueclusters", "multikueueclusters", wake=always)
        self.configs = self.informer(f"{KUEUE}/multikueueconfigs", "multikueueconfigs", wake=always)
