"""The operator authenticated as a Pod would be: only by a ServiceAccount's bearer token.

With the chart's ClusterRole bound, it decides as with a client certificate; with no permissions
at all, every tick fails and liveness says so (so that the kubelet restarts it and an operator
looks), instead of answering 200 forever."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import replace

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from localdev.operator import OperatorProcess, policy, service_account_kubeconfig
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import decided, make_pool, our_entry, submit

# How the API server's refusal reaches the log: the client's ApiException "(403)\nReason: Forbidden",
# the Status body's '"code":403' or its message "... is forbidden: User ...". A bare "403" is not one:
# a timestamp's milliseconds (",403") or a response size printed it in a passing run.
REFUSED = re.compile(r"forbidden|unauthorized|\(40[13]\)|\"code\":\s*40[13]\b", re.IGNORECASE)

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}


def _own_check(env, unique, controller: str):
    name = unique("token-policy")
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    check = unique("token-check")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, controller, params))
    return replace(env, check=check, controller=controller)


def test_an_operator_with_only_a_service_account_token_decides(env, namespace, unique):
    token_env = _own_check(env, unique, "sovereignspec.io/token")
    kubeconfig = service_account_kubeconfig(env.api, namespace, "sovereignspec")
    operator = OperatorProcess(token_env.controller, kubeconfig=kubeconfig).start()
    try:
        pool = make_pool(token_env, namespace, [("H100-SXM", "eu", 2, [0.95, 0.95])])
        submit(pool, "by-token", **CHAT)
        entry = our_entry(pool, decided(pool, "by-token"))
        assert entry["state"] == "Ready" and entry["message"].startswith("speculative"), entry["message"]
        logs = operator.logs()
        assert not REFUSED.search(logs) and "system:anonymous" not in logs, logs
    finally:
        operator.stop()


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_liveness_fails_when_every_tick_fails(env, namespace, unique):
    kubeconfig = service_account_kubeconfig(env.api, namespace, "nobody", cluster_role=None)
    operator = OperatorProcess("sovereignspec.io/forbidden", kubeconfig=kubeconfig).start()
    try:
        assert wait_until(lambda: _health(operator.liveness_port) == 500, timeout=60, what="liveness to fail")
        assert REFUSED.search(operator.logs()), operator.logs()
    finally:
        operator.stop()
