"""Our AdmissionChecks: each one's Active condition kept right, and the SpeculationPolicy it names
resolved (both roles; the one place a check's parameters are read)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.informer import Informer
from sovereignspec.operator.policy import GROUP, KIND, PolicySpec, parse_policy
from sovereignspec.operator.writer import API_ERRORS, ConflictError, Writer

log = logging.getLogger(__name__)


# A policy that vanishes is used as last seen for this long before its checks go inactive: Helm
# re-creates a hook object (the chart's policy) by deleting it first, and `kubectl replace --force`
# does the same; neither should flap the AdmissionCheck (and Kueue's ClusterQueue) inactive.
POLICY_GRACE_SECONDS = 10.0


class CheckReconciler:
    def __init__(
        self,
        checks: Informer,
        policies: Informer,
        writer: Writer,
        controller_name: str,
        profiles: ProfileSet,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.checks = checks  # the AdmissionChecks, watch-fed
        self.policies = policies  # the SpeculationPolicies, watch-fed
        self.writer = writer
        self.controller_name = controller_name
        self.profiles = profiles
        self.clock = clock
        self._seen: dict[str, tuple[dict[str, Any], float]] = {}  # policy name -> (object, last seen)

    def _policies(self) -> dict[str, dict[str, Any]]:
        """The policies now, and those gone for less than POLICY_GRACE_SECONDS as last seen."""
        now = self.clock()
        policies = {p["metadata"]["name"]: p for p in self.policies.items()}
        for name, policy in policies.items():
            self._seen[name] = (policy, now)
        for name, (policy, at) in list(self._seen.items()):
            if name in policies:
                continue
            if now - at < POLICY_GRACE_SECONDS:
                policies[name] = policy
            else:
                del self._seen[name]
        return policies

    def reconcile(self) -> tuple[dict[str, tuple[str, PolicySpec]], dict[str, PolicySpec]]:
        """Keep Active right on every AdmissionCheck we own. Returns the active ones with their
        policy, and every one of ours whose policy can be read (for the cluster-wide ledger)."""
        checks = self.checks.items()
        policies = self._policies()
        active: dict[str, tuple[str, PolicySpec]] = {}
        known: dict[str, PolicySpec] = {}
        for ac in checks:
            if (ac.get("spec") or {}).get("controllerName") != self.controller_name:
                continue
            name = ac["metadata"]["name"]
            try:
                ok, reason, message, resolved = self._resolve(ac, policies)
            except Exception as exc:  # one odd check object fails alone
                ok, reason, message, resolved = (
                    False,
                    "InvalidParameters",
                    f"{type(exc).__name__}: {exc}",
                    None,
                )
            known[name] = resolved[1] if resolved is not None else PolicySpec()
            if resolved is not None:
                active[name] = resolved
            current = next(
                (c for c in (ac.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"),
                None,
            )
            want = "True" if ok else "False"
            generation = ac["metadata"].get("generation", 0)
            generation = generation if isinstance(generation, int) else 0
            seen = (
                (current or {}).get("status"),
                (current or {}).get("reason"),
                (current or {}).get("message"),
            )
            if (
                current is None
                or seen != (want, reason, message)
                or current.get("observedGeneration") != generation
            ):
                try:
                    written = self.writer.admission_check_active(
                        name, ok, reason, message, generation, ac["metadata"].get("resourceVersion")
                    )
                    self.checks.put(written)
                except ConflictError:  # changed since it was read: judged again from its next version
                    log.info("AdmissionCheck %s changed while judged; judged again next tick", name)
                    continue
                except API_ERRORS as exc:
                    why = exc.reason if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
                    log.warning("could not set Active on AdmissionCheck %s: %s", name, why)
                    continue
                if not ok:
                    self.writer.event(ac, "AdmissionCheck", reason, message, warning=True)
                log.info("AdmissionCheck %s Active=%s (%s)", name, want, message)
        return active, known

    def _resolve(
        self, ac: dict[str, Any], policies: dict[str, dict[str, Any]]
    ) -> tuple[bool, str, str, tuple[str, PolicySpec] | None]:
        params = (ac.get("spec") or {}).get("parameters")
        if not params:
            return False, "BadParametersRef", f"spec.parameters must name a {KIND} ({GROUP})", None
        if params.get("apiGroup") != GROUP or params.get("kind") != KIND:
            got = f"{params.get('apiGroup')}/{params.get('kind')}"
            return False, "BadParametersRef", f"spec.parameters: got {got}; accepted: {GROUP}/{KIND}", None
        name = params.get("name", "")
        if name not in policies:
            return False, "BadParametersRef", f"{KIND} {name!r} not found", None
        try:
            spec = parse_policy(name, policies[name].get("spec"))
        except ValueError as exc:
            return False, "InvalidParameters", str(exc), None
        unknown = sorted(set(spec.profiles.gpu_products.values()) - set(self.profiles.gpus))
        if unknown or spec.defaults.model not in self.profiles.models:
            bad = unknown or [spec.defaults.model]
            return False, "InvalidParameters", f"{KIND} {name}: unknown profile(s) {bad}", None
        return True, "Active", f"uses {KIND} {name}", (name, spec)
