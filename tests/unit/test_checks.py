"""Our AdmissionChecks' Active condition from the caches, without a cluster: what is written, when
it is left alone, and the policy a check resolves to. (The writes themselves, against a real API
server, are in tests/cluster/test_operator.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from sovereignspec.operator.border.objects import AdmissionCheckView, PolicyObject
from sovereignspec.operator.border.workloads import MESSAGE_LIMIT
from sovereignspec.operator.roles.checks import POLICY_GRACE_SECONDS, CheckReconciler
from sovereignspec.operator.runtime.informer import Informer
from sovereignspec.operator.runtime.writer import ConflictError
from sovereignspec.profiles import load_profiles

OURS = "sovereignspec.io/speculation"
REF = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": "p"}


class Recorder:
    """The Writer's two calls the reconciler makes, recorded; the written check is returned as the
    API server returns it (its condition, a newer resourceVersion)."""

    def __init__(self) -> None:
        self.written: list[tuple[str, bool, str, str, int]] = []
        self.events: list[tuple[str, str, bool]] = []
        self.conflicts = 0

    def admission_check_active(
        self, name: str, active: bool, reason: str, message: str, generation: int = 0, rv: str | None = None
    ) -> dict[str, Any]:
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError(name)
        self.written.append((name, active, reason, message, generation))
        condition = {"type": "Active", "status": "True" if active else "False", "reason": reason,
                     "message": message[:MESSAGE_LIMIT], "observedGeneration": generation}  # fmt: skip
        return check(name, generation=generation, rv=str(int(rv or "1") + 1), conditions=[condition])

    def event(self, obj: dict[str, Any], kind: str, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((obj["metadata"]["name"], reason, warning))


def check(
    name: str,
    controller: str = OURS,
    params: Any = REF,
    generation: Any = 1,
    rv: str = "1",
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation, "resourceVersion": rv},
        "spec": {"controllerName": controller, "parameters": params},
        "status": {"conditions": conditions or []},
    }


def policy(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"}, "spec": spec}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts() -> tuple[CheckReconciler, Recorder, Clock]:
    api = client.ApiClient(client.Configuration())
    checks, policies = Informer(api, "/checks", "checks"), Informer(api, "/policies", "policies")
    writer, clock = Recorder(), Clock()
    reconciler = CheckReconciler(checks, policies, writer, OURS, load_profiles(), clock)  # type: ignore[arg-type]
    return reconciler, writer, clock


def test_a_check_of_ours_naming_a_readable_policy_is_made_active_once_and_then_left_alone(parts) -> None:
    r, w, _ = parts
    r.checks.put(check("spec"))
    r.policies.put(policy())
    active, known = r.reconcile()
    assert set(active) == set(known) == {"spec"} and active["spec"][0] == "p"
    assert w.written == [("spec", True, "Active", "uses SpeculationPolicy p", 1)] and w.events == []
    r.reconcile()
    assert len(w.written) == 1  # read back as written: nothing to change


def test_another_controllers_check_is_never_judged_or_written(parts) -> None:
    r, w, _ = parts
    r.checks.put(check("mk", controller="kueue.x-k8s.io/multikueue", params={"name": "sovereign"}))
    assert r.reconcile() == ({}, {})
    assert w.written == []


@pytest.mark.parametrize(
    ("params", "reason", "says"),
    [
        (None, "BadParametersRef", "spec.parameters must name a SpeculationPolicy"),
        ("p", "BadParametersRef", "spec.parameters must name a SpeculationPolicy"),
        ({**REF, "kind": "ConfigMap"}, "BadParametersRef", "got sovereignspec.io/ConfigMap"),
        ({**REF, "name": "gone"}, "BadParametersRef", "'gone' not found"),
    ],
)
def test_a_check_whose_parameters_do_not_resolve_is_inactive_with_the_reason_and_a_warning(
    parts, params: Any, reason: str, says: str
) -> None:
    r, w, _ = parts
    r.checks.put(check("spec", params=params))
    r.policies.put(policy())
    active, known = r.reconcile()
    assert active == {} and set(known) == {"spec"}  # known with the default policy: the ledger's
    [(name, ok, why, message, _)] = w.written
    assert (name, ok, why) == ("spec", False, reason) and says in message
    assert w.events == [("spec", reason, True)]


def test_a_policy_naming_an_unknown_profile_makes_its_check_inactive(parts) -> None:
    r, w, _ = parts
    r.checks.put(check("spec"))
    r.policies.put(policy(defaults={"model": "no-such-model"}))
    assert r.reconcile()[0] == {}
    assert w.written[0][1:3] == (False, "InvalidParameters") and "no-such-model" in w.written[0][3]


def test_a_message_longer_than_a_condition_holds_is_written_once_not_every_tick(parts) -> None:
    r, w, _ = parts
    r.checks.put(check("spec"))
    r.policies.put(policy(defaults={"model": "m" * (2 * MESSAGE_LIMIT)}))
    for _ in range(3):
        r.reconcile()
    assert len(w.written) == 1 and len(w.events) == 1
    assert len(w.written[0][3]) > MESSAGE_LIMIT  # the whole message goes to the writer (and the Event)


def test_a_condition_judged_at_an_older_generation_is_written_again_for_the_new_one(parts) -> None:
    r, w, _ = parts
    r.policies.put(policy())
    r.checks.put(check("spec"))
    r.reconcile()
    seen = AdmissionCheckView.of(r.checks.items()[0])
    assert seen.generation == 1 and seen.active_seen == ("True", "Active", "uses SpeculationPolicy p")
    conditions = [dict(seen.active or {})]
    r.checks.put(check("spec", generation=2, rv="9", conditions=conditions))
    r.reconcile()
    assert [g for *_, g in w.written] == [1, 2]


def test_a_conflicting_write_is_judged_again_from_the_next_tick_without_an_event(parts) -> None:
    r, w, _ = parts
    r.checks.put(check("spec", params={**REF, "name": "gone"}))
    w.conflicts = 1
    r.reconcile()
    assert w.written == [] and w.events == []
    r.reconcile()
    assert len(w.written) == 1 and len(w.events) == 1


def test_a_vanished_policy_keeps_its_checks_active_for_the_grace_then_not(parts) -> None:
    r, w, clock = parts
    r.checks.put(check("spec"))
    r.policies.put(policy())
    r.reconcile()
    r.policies._store.clear()  # deleted (Helm re-creating its hook object)
    clock.now += POLICY_GRACE_SECONDS - 0.5
    assert set(r.reconcile()[0]) == {"spec"} and len(w.written) == 1
    clock.now += 1.0
    assert r.reconcile()[0] == {}
    assert w.written[-1][1:3] == (False, "BadParametersRef")


def test_an_admission_check_view_reads_odd_fields_as_absent() -> None:
    view = AdmissionCheckView.of({"metadata": {"name": "x", "generation": "7"}, "spec": {"parameters": "p"}})
    assert (view.name, view.controller_name, view.parameters, view.generation) == ("x", None, None, 0)
    assert (view.active, view.active_seen, view.resource_version) == (None, (None, None, None), None)
    conditions = ["junk", {"type": "Active", "status": "True"}]
    odd = AdmissionCheckView.of(
        {"metadata": {"name": "y", "generation": True}, "status": {"conditions": conditions}}
    )
    assert odd.generation == 0 and odd.active_seen == ("True", None, None)


def test_a_policy_whose_spec_is_not_an_object_makes_its_check_inactive_not_a_default_policy(parts) -> None:
    # The view keeps the spec as written: read as absent, a string spec would be a policy of defaults.
    r, w, _ = parts
    r.checks.put(check("spec"))
    r.policies.put({"metadata": {"name": "p", "resourceVersion": "1"}, "spec": "everything allowed"})
    assert r.reconcile()[0] == {}
    assert w.written[0][1:3] == (False, "InvalidParameters") and "SpeculationPolicy p" in w.written[0][3]


def test_a_policy_view_reads_its_name_generation_and_spec_as_written() -> None:
    assert PolicyObject.of({"metadata": {"name": "p", "generation": 3}, "spec": {"a": 1}}) == PolicyObject(
        "p", 3, {"a": 1}
    )
    for odd in ("3", True, None):  # the record's generation: an integer or nothing
        assert PolicyObject.of({"metadata": {"name": "p", "generation": odd}}).generation is None
    assert PolicyObject.of({}) == PolicyObject("", None, None)
