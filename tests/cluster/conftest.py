"""Fixtures for tests that run against the real local control plane (marker `cluster`).

The session brings the control plane up with hack/cluster-up.sh, or reuses one that is already
running (then it leaves it running). Every test gets its own namespace; nothing relies on
namespace deletion, since the controller-manager here runs only the workload controllers.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from localdev import controlplane
from localdev.gpunodes import apply_examples
from localdev.prometheus import LocalPrometheus
from tests.waiting import wait_until


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[None]:
    reused = controlplane.is_ready()
    if not reused:
        controlplane.up()
    yield
    if not reused:
        controlplane.down()


@pytest.fixture(scope="session")
def api(control_plane: None) -> client.ApiClient:
    return controlplane.api_client("admin")


@pytest.fixture(scope="session")
def gpu_nodes(api: client.ApiClient) -> list[dict[str, Any]]:
    return apply_examples(api, ("00-gpu-nodes.yaml",))


@pytest.fixture
def namespace(api: client.ApiClient, request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{secrets.token_hex(3)}"
    client.CoreV1Api(api).create_namespace(
        {"metadata": {"name": name, "labels": {"sovereignspec.io/test": "true"}}}
    )
    return name


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Names for cluster-scoped objects that must not collide between tests."""
    token = secrets.token_hex(3)
    return lambda prefix: f"{prefix}-{token}"


@pytest.fixture
def prometheus() -> Iterator[LocalPrometheus]:
    prom = LocalPrometheus().start()
    yield prom
    prom.close()


@pytest.fixture(scope="session")
def operator_env(api: client.ApiClient) -> Iterator[tuple[Any, Any]]:
    """SovereignSpec installed (CRD, RBAC), synthetic telemetry behind a real Prometheus, a policy,
    our AdmissionCheck (Active) and the operator running as its own least-privilege user."""
    from localdev import kueue as k
    from localdev.gpunodes import server_side_apply
    from localdev.operator import OperatorProcess, SyntheticTelemetry, install, policy
    from tests.cluster.operator_env import Env

    install(api)
    telemetry = SyntheticTelemetry()
    prom = LocalPrometheus().start()
    prom.set_targets("synthetic", [telemetry.target])
    controller, check = "sovereignspec.io/e2e", "sovereignspec-e2e"
    server_side_apply(api, policy("e2e", prom.url, telemetry={"stalenessSeconds": 10}), "sovereignspec-e2e")
    k.apply(
        api,
        k.admission_check(
            check, controller, {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": "e2e"}
        ),
    )
    # Profiles refitted every 2 s, not every minute: test_learning.py's readings in seconds. Three
    # workloads placed per tick, not 500: every burst a test makes is decided over several ticks.
    operator = OperatorProcess(controller, extra=["--learn-refit-seconds", "2", "--tick-limit", "3"]).start()

    def active() -> bool:
        ac = client.CustomObjectsApi(api).get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "admissionchecks", check
        )
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in ac.get("status", {}).get("conditions", [])
        )

    wait_until(active, timeout=60, what="our AdmissionCheck to become Active")
    yield Env(api, telemetry, prom, check, controller), operator
    operator.stop()
    prom.close()
    telemetry.close()


@pytest.fixture
def env(operator_env: tuple[Any, Any]) -> Any:
    return operator_env[0]


@pytest.fixture
def operator(operator_env: tuple[Any, Any]) -> Any:
    return operator_env[1]
