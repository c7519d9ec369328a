"""The metrics endpoint behind authentication and authorisation (`--metrics-secure`, the chart's
default), against the real API server: the operator on a ServiceAccount token with the chart's
rules (its base ClusterRole and the reviews it needs, files/clusterrole-rules*.yaml), scraped with
no token, a stranger's token, and the token of a Prometheus account bound to the chart's
metrics-reader ClusterRole."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from localdev import controlplane
from localdev.gpunodes import server_side_apply
from localdev.operator import OperatorProcess, service_account_kubeconfig

FILES = controlplane.REPO / "charts" / "sovereignspec" / "files"
RBAC = "rbac.authorization.k8s.io"


def cluster_role(api: client.ApiClient, name: str, rules_file: str) -> str:
    rules = yaml.safe_load((FILES / rules_file).read_text())
    server_side_apply(api, {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": name},
                            "rules": rules}, "sovereignspec-e2e")  # fmt: skip
    return name


def token(api: client.ApiClient, namespace: str, account: str) -> str:
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    return str(
        client.CoreV1Api(api)
        .create_namespaced_service_account_token(account, namespace, request)
        .status.token
    )


def scrape(port: int, bearer: str | None = None, scheme: str = "https") -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # its self-signed certificate
    headers = {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context if scheme == "https" else None) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def secure_operator(api: client.ApiClient, namespace: str, unique: Any) -> Iterator[OperatorProcess]:
    auth = cluster_role(api, unique("metrics-auth"), "clusterrole-rules-metrics-auth.yaml")
    kubeconfig = service_account_kubeconfig(api, namespace, "sovereignspec", extra_roles=(auth,))
    operator = OperatorProcess("sovereignspec.io/metrics-auth", extra=["--metrics-secure"],
                               kubeconfig=kubeconfig).start()  # fmt: skip
    yield operator
    operator.stop()


def test_metrics_are_refused_without_a_token_or_rbac_and_served_to_the_metrics_reader(
    api, namespace, unique, secure_operator
):
    port = secure_operator.metrics_port
    status, body = scrape(port)
    assert status == 401 and "a bearer token is required" in body
    status, body = scrape(port, "not-a-token")
    assert status == 401 and "the token is not valid" in body
    core = client.CoreV1Api(api)
    for account in ("stranger", "prometheus"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    status, body = scrape(port, token(api, namespace, "stranger"))
    assert status == 403, body
    assert f"system:serviceaccount:{namespace}:stranger may not get /metrics" in body
    reader = cluster_role(api, unique("metrics-reader"), "clusterrole-rules-metrics-reader.yaml")
    prometheus = {"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}
    binding = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": reader},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": reader},
        "subjects": [prometheus],
    }
    server_side_apply(api, binding, "sovereignspec-e2e")
    status, body = scrape(port, token(api, namespace, "prometheus"))
    assert status == 200, body
    assert "sovereignspec_decisions_total" in body or "sovereignspec_cache_objects" in body
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port, scheme="http")  # no plain HTTP on the secure port
