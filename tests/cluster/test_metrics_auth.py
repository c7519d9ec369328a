"""The metrics endpoint behind authentication and authorisation (`--metrics-secure`, the chart's
default), against the real API server: the operator on a ServiceAccount token with the chart's
rules (its base ClusterRole and the reviews it needs, files/clusterrole-rules*.yaml), scraped with
no token, a stranger's token, and the token of a Prometheus account bound to the chart's
metrics-reader ClusterRole."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
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


def reader_token(api: client.ApiClient, namespace: str, unique: Any) -> str:
    """A token of a "prometheus" ServiceAccount bound to the chart's metrics-reader ClusterRole."""
    client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "prometheus"}})
    reader = cluster_role(api, unique("metrics-reader"), "clusterrole-rules-metrics-reader.yaml")
    binding = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": reader},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": reader},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
    }
    server_side_apply(api, binding, "sovereignspec-e2e")
    return token(api, namespace, "prometheus")


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
    client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "stranger"}})
    status, body = scrape(port, token(api, namespace, "stranger"))
    assert status == 403, body
    assert f"system:serviceaccount:{namespace}:stranger may not get /metrics" in body
    status, body = scrape(port, reader_token(api, namespace, unique))
    assert status == 200, body
    assert "sovereignspec_decisions_total" in body or "sovereignspec_cache_objects" in body
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port, scheme="http")  # no plain HTTP on the secure port


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


def closed_by_the_server(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


def test_stalled_connections_and_bogus_tokens_are_bounded_and_a_reader_is_still_answered(
    api, namespace, unique, secure_operator
):
    # 400 clients that connect and send nothing, and 64 requests each with its own bogus token,
    # at once. The operator holds at most MAX_CONNECTIONS of them (a thread each), closes each
    # stalled one within IDLE_SECONDS, writes a few lines about them and no traceback, and the
    # metrics reader (its token answered once already) is served throughout. Before: one thread
    # per stalled connection, held for ever, a traceback per client that went away.
    from concurrent.futures import ThreadPoolExecutor

    from sovereignspec.operator.runtime.secure_metrics import IDLE_SECONDS, MAX_CONNECTIONS

    port, pid = secure_operator.metrics_port, secure_operator.proc.pid
    good = reader_token(api, namespace, unique)
    assert scrape(port, good)[0] == 200
    before = threads_of(pid)
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(400)]
    try:
        with ThreadPoolExecutor(16) as pool:
            bogus = [pool.submit(scrape, port, f"bogus-{i}-{unique('t')}") for i in range(64)]
            time.sleep(1.0)  # the stalled ones accepted and waiting
            most = threads_of(pid)
            started = time.monotonic()
            status, body = scrape(port, good)
            took = time.monotonic() - started
            answers = [f.result()[0] for f in bogus]
        print(f"reader answered in {took:.3f} s under the flood; threads {before} -> {most}")
        assert status == 200 and "sovereignspec_" in body, body
        assert set(answers) <= {401, 503}, answers  # refused, or asked to come back: never let in
        assert most <= before + MAX_CONNECTIONS + 16, (before, most)
        deadline = time.monotonic() + IDLE_SECONDS + 10
        while time.monotonic() < deadline and not all(closed_by_the_server(s) for s in stalled):
            time.sleep(0.5)
        assert all(closed_by_the_server(s) for s in stalled), "stalled connections held past their time"
    finally:
        for s in stalled:
            s.close()
    logs = secure_operator.logs()
    assert "Traceback" not in logs, logs[-3000:]
    dropped = [line for line in logs.splitlines() if "metrics: dropped" in line]
    assert 1 <= len(dropped) <= 60, dropped[:5]
