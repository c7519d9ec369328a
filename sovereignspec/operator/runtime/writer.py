"""Every write the controller makes. Only our own admission-check entry on a Workload, by
server-side apply to /status under our field manager with only that entry in the body, guarded
by the resourceVersion we decided on (so a decision about a workload that changed meanwhile is
dropped and taken again, never applied to the wrong state); AdmissionCheck conditions; Events."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.operator.border.workloads import EVENT_LIMIT, MESSAGE_LIMIT
from sovereignspec.operator.runtime import metrics

log = logging.getLogger(__name__)

KUEUE = "kueue.x-k8s.io/v1beta2"
WRITE_SECONDS = 10.0  # the longest a status write may take, client and server side


def as_written(message: str) -> str:
    """A check entry's or condition's message as we write it, and so as it reads back: what a
    decision compares with what is there (an uncut longer one never matches, and is written again
    every tick)."""
    return message[:MESSAGE_LIMIT]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_entry_apply(
    workload: dict[str, Any],
    check: str,
    state: str,
    message: str,
    previous: dict[str, Any] | None,
    now: str,
    pod_set_updates: list[dict[str, Any]] | None = None,
    requeue_after: int | None = None,
    extra_status: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The path and body of the server-side apply that sets our entry: nothing but that entry (and
    `extra_status`), guarded by the resourceVersion decided on; the transition time kept while the
    state stays (`previous`: the entry as read), `now` when it changes."""
    meta = workload["metadata"]
    changed = previous is None or previous.get("state") != state or "lastTransitionTime" not in previous
    entry: dict[str, Any] = {
        "name": check,
        "state": state,
        "message": as_written(message),
        "lastTransitionTime": now if changed else previous["lastTransitionTime"],  # type: ignore[index]
    }
    if pod_set_updates is not None:
        entry["podSetUpdates"] = pod_set_updates
    if requeue_after is not None:
        entry["requeueAfterSeconds"] = requeue_after
    body = {
        "apiVersion": KUEUE,
        "kind": "Workload",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "resourceVersion": meta["resourceVersion"],
        },
        "status": {"admissionChecks": [entry], **(extra_status or {})},
    }
    return f"/apis/{KUEUE}/namespaces/{meta['namespace']}/workloads/{meta['name']}/status", body


class NotLeaderError(Exception):
    """A write refused before it was sent: this replica does not (surely) hold the leader Lease."""


# What a request can fail with below the API's answer: a connection refused or reset, a server
# that went away mid-response (urllib3's ProtocolError during an API server shutdown), or a write
# this replica may no longer send (leadership ending). Each is one request's failure, never the
# pass's: the workload is decided again next tick (by whoever leads then).
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError, NotLeaderError)
API_ERRORS: tuple[type[Exception], ...] = (ApiException, *TRANSPORT_ERRORS)


class ConflictError(Exception):
    """The object changed since it was read; the caller decides again next tick."""


WRITE_ERRORS: tuple[type[Exception], ...] = (ConflictError, *API_ERRORS)


class Writer:
    def __init__(self, api: client.ApiClient, field_manager: str, component: str = "sovereignspec") -> None:
        self.api = api
        self.field_manager = field_manager
        self.component = component
        # Around every request that writes: with leader election, `LeaderElector.fence` (refuses
        # the write, NotLeaderError, unless this replica surely leads, and yields the seconds left
        # of its claim); without, nothing (None: a write's default bound).
        self.fence: Callable[[], AbstractContextManager[float | None]] = nullcontext
        # Before a batch of decisions is sent: with leader election, `LeaderElector.announce` (their
        # keys into the Lease, for a successor to seal; raises unless that landed); without, nothing.
        self.announce: Callable[[list[str]], None] = lambda keys: None

    def _apply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.fence() as left:
            return self._send_apply(path, body, WRITE_SECONDS if left is None else left)

    def _send_apply(self, path: str, body: dict[str, Any], left: float = WRITE_SECONDS) -> dict[str, Any]:
        # The write's lifetime bounded on both sides: the client stops waiting, and the API server
        # stops working on it (`timeout`, its request deadline), once the claim it was sent under
        # has run out.
        seconds = max(1, min(int(WRITE_SECONDS), math.ceil(left)))
        try:
            resp = self.api.call_api(
                *self.api.param_serialize(
                    method="PATCH",
                    resource_path=path,
                    query_params=[
                        ("fieldManager", self.field_manager),
                        ("force", "true"),
                        ("timeout", f"{seconds}s"),
                    ],
                    header_params={
                        "Content-Type": "application/apply-patch+yaml",
                        "Accept": "application/json",
                    },
                    body=body,
                    auth_settings=["BearerToken"],  # a ServiceAccount token is sent only so
                ),
                _request_timeout=(min(2.0, float(seconds)), float(seconds)),
            )
            data = resp.read()
            if resp.status == 409:
                raise ConflictError(path)
            if resp.status >= 400:
                raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:500])
            return dict(json.loads(data))
        except ApiException as exc:
            if exc.status == 409:
                raise ConflictError(path) from exc
            raise

    def check_state(
        self,
        workload: dict[str, Any],
        check: str,
        state: str,
        message: str,
        previous: dict[str, Any] | None,
        pod_set_updates: list[dict[str, Any]] | None = None,
        requeue_after: int | None = None,
        extra_status: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Set our entry of status.admissionChecks (and nothing else but `extra_status`: the
        dispatcher's nominatedClusterNames, applied in the same request as its Ready entry)."""
        path, body = check_entry_apply(
            workload,
            check,
            state,
            message,
            previous,
            now_rfc3339(),
            pod_set_updates,
            requeue_after,
            extra_status,
        )
        return self._apply(path, body)

    def admission_check_active(
        self,
        name: str,
        active: bool,
        reason: str,
        message: str,
        generation: int = 0,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """The Active condition, for the generation it was judged at (`kubectl wait --for
        condition=Active` ignores a condition whose observedGeneration is older than the object),
        guarded by the resourceVersion it was judged on (ConflictError if it changed since)."""
        meta: dict[str, Any] = {"name": name}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {
            "apiVersion": KUEUE,
            "kind": "AdmissionCheck",
            "metadata": meta,
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True" if active else "False",
                        "reason": reason,
                        "message": as_written(message),
                        "lastTransitionTime": now_rfc3339(),
                        "observedGeneration": generation,
                    }
                ]
            },
        }
        return self._apply(f"/apis/{KUEUE}/admissionchecks/{name}/status", body)

    def learned_profile(
        self, name: str, gpu_type: str, model: str, create: bool, status: dict[str, Any]
    ) -> None:
        """A LearnedProfile's status (and, `create`, the object first: only its spec's gpuType and
        model are ours; `use` and `frozen` stay the administrator's)."""
        path = f"/apis/sovereignspec.io/v1alpha1/learnedprofiles/{name}"
        head: dict[str, Any] = {"apiVersion": "sovereignspec.io/v1alpha1", "kind": "LearnedProfile"}
        head["metadata"] = {"name": name}
        if create:
            self._apply(path, {**head, "spec": {"gpuType": gpu_type, "model": model}})
        self._apply(f"{path}/status", {**head, "status": status})

    def event(self, obj: dict[str, Any], kind: str, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on `obj`; failures are logged, never raised (an Event is a courtesy)."""
        meta = obj["metadata"]
        stamp = now_rfc3339()
        body: dict[str, Any] = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace") or "default"},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", KUEUE),
                "kind": kind,
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:EVENT_LIMIT],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            with self.fence():
                client.CoreV1Api(self.api).create_namespaced_event(
                    body["metadata"]["namespace"], cast(Any, body)
                )
        except API_ERRORS as exc:
            metrics.TICK_FAILURES.labels(part="event").inc()
            log.warning(
                "could not post Event %s on %s/%s: %s",
                reason,
                meta.get("namespace"),
                meta["name"],
                exc.reason if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}",
            )
