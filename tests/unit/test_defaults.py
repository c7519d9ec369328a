"""The decision's defaults live in `core.defaults`; every place a user reads one says the same."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sovereignspec.core import defaults
from sovereignspec.core.cluster import PlacerSettings
from sovereignspec.operator.border.policy import PolicySpec

ROOT = Path(__file__).resolve().parents[2]
# (path into a SpeculationPolicy spec, the default it must carry)
FIELDS = [
    (("gammaMax",), defaults.GAMMA_MAX),
    (("selfBenefitMargin",), defaults.SELF_BENEFIT_MARGIN),
    (("neighbourSloMargin",), defaults.NEIGHBOUR_SLO_MARGIN),
    (("telemetry", "headroomUncertainty"), defaults.HEADROOM_UNCERTAINTY),
]


def _dig(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "sovereignspec.io_speculationpolicies.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


@pytest.mark.parametrize(("path", "value"), FIELDS, ids=lambda x: ".".join(x) if isinstance(x, tuple) else "")
def test_the_crd_the_chart_and_the_example_default_to_the_one_home(
    path: tuple[str, ...], value: float
) -> None:
    node = _crd_schema()
    for key in path:
        node = node["properties"][key]
    assert node["default"] == value
    values = yaml.safe_load((ROOT / "charts" / "sovereignspec" / "values.yaml").read_text())
    assert _dig(values["policy"]["spec"], path) == value
    examples = ROOT / "deploy" / "examples" / "without-chart" / "sovereignspec.yaml"
    for doc in yaml.safe_load_all(examples.read_text()):
        if doc and doc.get("kind") == "SpeculationPolicy":
            with contextlib.suppress(KeyError):  # not written there: the CRD's default applies
                assert _dig(doc["spec"], path) == value


def test_the_operators_policy_and_the_placer_default_alike() -> None:
    spec, policy = PolicySpec(), PlacerSettings()
    assert (spec.gamma_max, spec.self_benefit_margin, spec.neighbour_slo_margin) == (
        policy.gamma_max,
        policy.margin,
        policy.slo_margin,
    )
    assert spec.telemetry.headroom_uncertainty == policy.headroom_uncertainty


@pytest.mark.parametrize(
    ("client", "said"),
    [
        ({"tls": {"certFile": "/etc/p/tls.crt"}}, "certFile and keyFile: give both"),
        ({"authorization": {"credentialsFile": "/t"}, "basicAuth": {"username": "u", "passwordFile": "/p"}},
         "authorization and basicAuth: give one of them, not both"),
        ({"authorization": {"credentialsFile": "token"}}, "credentialsFile"),
        ({"retries": 9}, "retries"),
    ],
)  # fmt: skip
def test_a_prometheus_client_setting_that_cannot_work_names_its_field(client, said) -> None:
    from sovereignspec.operator.border.policy import parse_policy

    spec = {"telemetry": {"prometheusURL": "https://p:9090", "prometheusClient": client}}
    with pytest.raises(ValueError, match=said):
        parse_policy("p", spec)


def test_the_crd_keeps_every_prometheus_client_field_the_policy_reads() -> None:
    """A structural CRD prunes what its schema does not name: each field of the model must be there."""
    from sovereignspec.operator.border import policy

    crd = yaml.safe_load((ROOT / "crds" / "sovereignspec.io_speculationpolicies.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema = spec["properties"]["telemetry"]["properties"]["prometheusClient"]

    def names(model: type) -> set[str]:
        return {f.alias or n for n, f in model.model_fields.items()}

    assert set(schema["properties"]) == names(policy.PrometheusClient)
    for key, sub in (("authorization", "Authorization"), ("basicAuth", "BasicAuth"), ("tls", "Tls")):
        assert set(schema["properties"][key]["properties"]) == names(getattr(policy, sub)), key


def _missing_from_crd(model: type, schema: dict[str, Any], at: str) -> list[str]:
    """Every field of a policy model (by its alias, nested models walked) that the CRD's schema at
    the same place does not name: a structural CRD prunes it, and the user's setting is dropped
    without a word."""
    from pydantic import BaseModel

    out = []
    properties = schema.get("properties")
    for name, f in model.model_fields.items():  # type: ignore[attr-defined]
        key = f.alias or name
        if properties is None:  # a map (additionalProperties): its values are the user's
            continue
        if key not in properties:
            out.append(f"{at}{key}")
            continue
        inner = f.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out += _missing_from_crd(inner, properties[key], f"{at}{key}.")
    return out


def test_the_crd_names_every_field_of_the_policy_so_none_is_pruned() -> None:
    assert _missing_from_crd(PolicySpec, _crd_schema(), "spec.") == []


# The fields the CRD's schema defaults. The API server writes a schema default into every policy it
# serves, and an operator older than the CRD (a rolling upgrade, a rollback: CRDs outlive their
# chart) refuses a field it does not know, making its AdmissionCheck inactive and its ClusterQueues
# admit nothing. So a field added later carries its default in the operator's model alone, and
# this list does not grow (make pod-e2e found it: stepWindowSeconds, defaulted here, deactivated the
# previous image's check).
DEFAULTED_BY_THE_SCHEMA = {
    "telemetry.source", "telemetry.prometheusClient.timeoutSeconds", "telemetry.prometheusClient.retries",
    "telemetry.prometheusClient.authorization.type", "telemetry.stalenessSeconds",
    "telemetry.headroomUncertainty", "telemetry.predictionErrorBound", "telemetry.acceptance.learn",
    "telemetry.acceptance.window", "telemetry.acceptance.priorWeightTokens",
    "telemetry.acceptance.sglangAcceptRate", "gammaMax", "selfBenefitMargin", "externality",
    "neighbourSloMargin", "reevaluationSeconds",
}  # fmt: skip


def test_no_field_the_previous_operators_do_not_know_is_defaulted_by_the_crds_schema() -> None:
    found: set[str] = set()

    def walk(node: dict[str, Any], at: str) -> None:
        if "default" in node:
            found.add(at)
        for key, inner in (node.get("properties") or {}).items():
            walk(inner, f"{at}.{key}" if at else key)

    walk(_crd_schema(), "")
    assert found <= DEFAULTED_BY_THE_SCHEMA, sorted(found - DEFAULTED_BY_THE_SCHEMA)
