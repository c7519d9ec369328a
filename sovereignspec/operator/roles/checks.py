"""Our AdmissionChecks: each one's Active condition kept right, and the SpeculationPolicy it names
resolved (both roles; the one place a check's parameters are read)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border.objects import AdmissionCheckView, PolicyObject
from sovereignspec.operator.border.policy import GROUP, KIND, PolicySpec, parse_policy
from sovereignspec.operator.runtime.informer import Informer
from sovereignspec.operator.runtime.writer import API_ERRORS, ConflictError, Writer, as_written

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
        self._seen: dict[str, tuple[PolicyObject, float]] = {}  # policy name -> (object, last seen)

    def _policies(self) -> dict[str, PolicyObject]:
        """The policies now, and those gone for less than POLICY_GRACE_SECONDS as last seen."""
        now = self.clock()
        policies = {p.name: p for p in map(PolicyObject.of, self.policies.items())}
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
        for ac in map(AdmissionCheckView.of, checks):
            if ac.controller_name != self.controller_name:
                continue
            try:
                ok, reason, message, resolved = self._resolve(ac, policies)
            except Exception as exc:  # one odd check object fails alone
                why = f"{type(exc).__name__}: {exc}"
                ok, reason, message, resolved = False, "InvalidParameters", why, None
            known[ac.name] = resolved[1] if resolved is not None else PolicySpec()
            if resolved is not None:
                active[ac.name] = resolved
            want = "True" if ok else "False"
            # Compared as written: a longer message is cut there, and the cut one read back must
            # not look changed (it would be written again, with a Warning Event, every tick).
            written = (want, reason, as_written(message))
            if (
                ac.active is not None
                and ac.active_seen == written
                and ac.active.get("observedGeneration") == ac.generation
            ):
                continue
            self._set_active(ac, ok, reason, message)
        return active, known

    def _set_active(self, ac: AdmissionCheckView, ok: bool, reason: str, message: str) -> None:
        """Write Active as judged; a conflict or a failed write is judged again next tick."""
        try:
            written = self.writer.admission_check_active(
                ac.name, ok, reason, message, ac.generation, ac.resource_version
            )
            self.checks.put(written)
        except ConflictError:  # changed since it was read: judged again from its next version
            log.info("AdmissionCheck %s changed while judged; judged again next tick", ac.name)
            return
        except API_ERRORS as exc:
            why = exc.reason if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
            log.warning("could not set Active on AdmissionCheck %s: %s", ac.name, why)
            return
        if not ok:
            self.writer.event(dict(ac.raw), "AdmissionCheck", reason, message, warning=True)
        log.info("AdmissionCheck %s Active=%s (%s)", ac.name, "True" if ok else "False", message)

    def _resolve(
        self, ac: AdmissionCheckView, policies: dict[str, PolicyObject]
    ) -> tuple[bool, str, str, tuple[str, PolicySpec] | None]:
        params = ac.parameters
        if not params:
            return False, "BadParametersRef", f"spec.parameters must name a {KIND} ({GROUP})", None
        if params.get("apiGroup") != GROUP or params.get("kind") != KIND:
            got = f"{params.get('apiGroup')}/{params.get('kind')}"
            return False, "BadParametersRef", f"spec.parameters: got {got}; accepted: {GROUP}/{KIND}", None
        name = params.get("name", "")
        if name not in policies:
            return False, "BadParametersRef", f"{KIND} {name!r} not found", None
        try:
            spec = parse_policy(name, policies[name].spec)
        except ValueError as exc:
            return False, "InvalidParameters", str(exc), None
        unknown = sorted(set(spec.profiles.gpu_products.values()) - set(self.profiles.gpus))
        if unknown or spec.defaults.model not in self.profiles.models:
            bad = unknown or [spec.defaults.model]
            return False, "InvalidParameters", f"{KIND} {name}: unknown profile(s) {bad}", None
        return True, "Active", f"uses {KIND} {name}", (name, spec)
