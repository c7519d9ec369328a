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

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border import kinds
from sovereignspec.operator.border.cuts import (
    strip,
    strip_node,
    strip_owner,
    strip_pod,
    strip_queued_pod,
    strip_statefulset,
    strip_workload,
)
from sovereignspec.operator.runtime import metrics

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PAGE = 500  # objects per LIST page: bounds the memory of one response
LEARNED_PATH = "/apis/sovereignspec.io/v1alpha1/learnedprofiles"  # operator.learning.PATH
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
    # An optional feature's resource whose read the role may not grant (an operator image newer
    # than the chart whose ClusterRole it runs under): a 403 is then an empty cache in sync, like
    # an absent API, said once as a warning, and tried again every ABSENT_RECHECK seconds.
    forbidden_is_absent: bool = False

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
            with contextlib.suppress(OSError):  # EBADF: its thread closed it meanwhile, so it is unblocked
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
                if raw.status == 403 and self.forbidden_is_absent and not cont:
                    return self._absent(forbidden=data.decode(errors="replace")[:300])
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

    def _absent(self, forbidden: str = "") -> str:
        if forbidden and not self.absent:
            log.warning(
                "%s: this role may not list them (%s): an empty cache, the feature off until it may "
                "(upgrade the chart, or grant list/watch on %s)",
                self.name,
                forbidden,
                self.name,
            )
        elif not self.absent:
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
        # What the engines taught (operator/decision/learning.py); optional: a cluster whose CRDs predate it
        # still decides, with the shipped profiles.
        self.learned = informer(LEARNED_PATH, "learnedprofiles", optional=True, forbidden_is_absent=True)
        self.flavors = informer(f"{KUEUE}/resourceflavors", "resourceflavors", wake=always)
        self.nodes = informer(
            "/api/v1/nodes", "nodes", transform=strip_node, wake=lambda k, _o: k in ("ADDED", "DELETED")
        )
        self.namespaces = informer("/api/v1/namespaces", "namespaces")
        # Ended pods stay until deleted (the ledger and the watch skip them by phase) so that the
        # record learns how each ended: filtered by phase, a watch sees it vanish in its last state.
        bound = [("fieldSelector", "spec.nodeName!=")]
        self.pods = informer("/api/v1/pods", "pods", query=bound, transform=strip_pod)
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
