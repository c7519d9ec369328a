"""What the worker and the dispatcher roles share: settings, the tick's report, the writer and its
thread pool, the AdmissionCheck reconciler, the clock, and the workloads left alone after a
conflicting write. Each role's tick is its own (`controller.Controller`, `dispatcher`)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.checks import CheckReconciler
from sovereignspec.operator.informer import ClusterCache, DispatchCache
from sovereignspec.operator.policy import PolicySpec
from sovereignspec.operator.writer import Writer


@dataclass(frozen=True)
class Settings:
    controller_name: str = "sovereignspec.io/speculation"
    field_manager: str = "sovereignspec-controller"
    write_workers: int = 8
    telemetry_cache_seconds: float = 1.0
    # A cache that cannot be listed or watched for this long fails the tick (and, repeated, the
    # liveness probe); shorter gaps (an API server restart) only pause the decisions.
    unsynced_grace_seconds: float = 60.0
    nominate: int = 1  # dispatcher role: worker clusters nominated per workload (the best first)


@dataclass
class TickReport:
    decided: int = 0
    conflicts: int = 0
    more: bool = False  # another policy group still has pending work: tick again now
    reevaluate_after: float = 10.0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failures: list[str] = field(default_factory=list)  # what failed alone this tick


class Role:
    def __init__(
        self,
        api: client.ApiClient,
        profiles: ProfileSet,
        settings: Settings,
        cache: ClusterCache | DispatchCache,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.profiles = profiles
        self.settings = settings
        self.cache = cache
        self.clock = clock  # wall time for decisions (telemetry ages, snapshots); tests may fix it
        self.writer = Writer(api, settings.field_manager)
        self.check_reconciler = CheckReconciler(
            cache.checks, cache.policies, self.writer, settings.controller_name, profiles
        )
        self._pool = ThreadPoolExecutor(settings.write_workers, thread_name_prefix="sovereignspec-write")
        # Workloads whose write conflicted, at the resourceVersion that conflicted: not decided
        # again until the watch brings a newer one (re-deciding the same stale copy cannot succeed).
        self._conflicted: dict[str, int | None] = {}

    def tick(self) -> TickReport:
        raise NotImplementedError

    def reconcile_checks(self) -> tuple[dict[str, tuple[str, PolicySpec]], dict[str, PolicySpec]]:
        return self.check_reconciler.reconcile()

    def _list(
        self, path: str, query: list[tuple[str, str]] | None = None, accept: str | None = None
    ) -> list[dict[str, Any]]:
        """A raw LIST (JSON, no model classes), for what is read once: our Events after start-up."""
        resp = self.api.call_api(
            *self.api.param_serialize(
                method="GET",
                resource_path=path,
                query_params=query or [],
                header_params={"Accept": accept or "application/json"},
                # The client's own auth path: a bearer token (ServiceAccount, OIDC) is sent only so.
                auth_settings=["BearerToken"],
            )
        )
        data = resp.read()
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:300])
        doc = json.loads(data)
        kind = doc.get("kind", "").removesuffix("List")
        version = doc.get("apiVersion")
        for item in doc.get("items") or []:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", version)
        return list(doc.get("items") or [])
