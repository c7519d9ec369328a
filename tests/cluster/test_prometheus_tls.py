"""Telemetry from a Prometheus as it is deployed: behind TLS with a private CA, requiring a client
certificate and basic auth (Prometheus's own `--web.config.file`), and behind a bearer-token gate
(as kube-rbac-proxy puts one in front of it: Prometheus's web configuration has no bearer tokens).

The reader gets through with the right files, is told plainly what is wrong with the wrong ones
(and does not retry what will not pass), retries what may pass (503s) a bounded number of times,
reads a rotated token again, and the operator decides plain decode with that reason, never crashes.
"""

from __future__ import annotations

import base64
import ssl
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from localdev.operator import SyntheticTelemetry, policy
from localdev.prometheus import LocalPrometheus, WebSecurity
from localdev.tls import Pki, make_pki
from localdev.token_proxy import TokenProxy
from sovereignspec.telemetry.prometheus import ClientConfig, PrometheusError, PrometheusReader
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import decided, make_pool, our_entry, submit

USER, PASSWORD, TOKEN = "sovereignspec", "correct horse battery staple", "s3cr3t-token-1"
CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}


def bcrypt_hash(password: str) -> str:
    """Prometheus's web configuration wants bcrypt; glibc's crypt (libxcrypt) makes it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # deprecated in 3.11, and the one bcrypt in the standard library

    return str(crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH)))


@dataclass
class Secured:
    pki: Pki
    other: Pki  # a CA that signed nothing of this Prometheus
    prometheus: LocalPrometheus
    proxy: TokenProxy
    files: Path  # the operator's "mounted Secrets": token, password

    def client(self, **overrides: Any) -> ClientConfig:
        """What gets through to Prometheus itself: its CA, a client certificate, basic auth."""
        base = ClientConfig(
            ca_file=str(self.pki.ca), cert_file=str(self.pki.client_cert), key_file=str(self.pki.client_key),
            basic_auth_username=USER, basic_auth_password_file=str(self.files / "password"), backoff=0.01,
        )  # fmt: skip
        return replace(base, **overrides)

    def through_proxy(self, **overrides: Any) -> ClientConfig:
        """What gets through the token gate: its CA and the token."""
        return replace(ClientConfig(ca_file=str(self.pki.ca), bearer_token_file=str(self.files / "token"),
                                    backoff=0.01), **overrides)  # fmt: skip


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("prometheus-tls")
    pki, other = make_pki(folder / "pki"), make_pki(folder / "other", name="other-ca")
    files = folder / "secrets"
    files.mkdir()
    (files / "password").write_text(PASSWORD + "\n")
    (files / "token").write_text(TOKEN + "\n")
    harness = ssl.create_default_context(cafile=str(pki.ca))
    harness.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    basic = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
    web = WebSecurity(
        {
            "tls_server_config": {
                "cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca),
            },
            "basic_auth_users": {USER: bcrypt_hash(PASSWORD)},
        },
        harness,
        basic,
    )  # fmt: skip
    telemetry = SyntheticTelemetry()
    for gpu in range(2):
        telemetry.set_headroom("tls-node", gpu, 0.9)
    prom = LocalPrometheus(web=web).start()
    prom.set_targets("synthetic", [telemetry.target])
    wait_until(lambda: prom.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), timeout=30, what="a scrape")
    proxy = TokenProxy(prom.url, files / "token", pki.server_cert, pki.server_key, harness, basic).start()
    yield Secured(pki, other, prom, proxy, files)
    proxy.close()
    prom.close()
    telemetry.close()


def read(url: str, client: ClientConfig) -> Any:
    return PrometheusReader(url, client=client, sleep=lambda _s: None).snapshot()


def test_prometheus_behind_tls_a_client_certificate_and_basic_auth_is_read_with_its_files(secured):
    snap = read(secured.prometheus.url, secured.client())
    assert snap.error is None, snap.error
    assert {("tls-node", 0), ("tls-node", 1)} <= set(snap.gpus)


def test_prometheus_behind_a_token_gate_is_read_with_the_token_file_read_again_after_rotation(secured):
    token = secured.files / "token"
    snap = read(secured.proxy.url, secured.through_proxy())
    assert snap.error is None and ("tls-node", 0) in snap.gpus, snap.error
    token.write_text("s3cr3t-token-2\n")  # the kubelet rotates a projected token in place
    try:
        snap = read(secured.proxy.url, secured.through_proxy())
        assert snap.error is None, snap.error
        assert secured.proxy.seen[-1] == "Bearer s3cr3t-token-2"
    finally:
        token.write_text(TOKEN + "\n")


@pytest.mark.parametrize(
    ("wrong", "expected"),
    [
        ({"ca_file": "other"}, "its certificate does not verify (unable to get local issuer certificate); "
                               "check telemetry.prometheusClient.tls.caFile"),
        ({"cert_file": None, "key_file": None}, "TLS failed"),
        ({"basic_auth_password_file": "bad-password"},
         "refused the basic-auth credentials (401 Unauthorized); check telemetry.prometheusClient.basicAuth"),
        ({"basic_auth_password_file": "/nonexistent/password"},
         "telemetry.prometheusClient.basicAuth.passwordFile /nonexistent/password: cannot read it"),
    ],
)  # fmt: skip
def test_the_wrong_files_say_what_is_wrong_and_are_not_retried(secured, tmp_path, wrong, expected):
    if wrong.get("ca_file") == "other":
        wrong = {"ca_file": str(secured.other.ca)}
    if wrong.get("basic_auth_password_file") == "bad-password":
        (tmp_path / "password").write_text("not the password")
        wrong = {"basic_auth_password_file": str(tmp_path / "password")}
    slept: list[float] = []
    reader = PrometheusReader(secured.prometheus.url, client=secured.client(**wrong), sleep=slept.append)
    with pytest.raises(PrometheusError) as raised:
        reader.query("up")
    assert expected in str(raised.value)
    assert slept == []  # refused credentials or a certificate that does not verify: no retry
    snap = reader.snapshot()  # what the operator takes: an error, no readings, no exception
    assert snap.gpus == {} and expected in str(snap.error)


def test_a_wrong_token_is_refused_by_name_and_not_retried(secured, tmp_path):
    (tmp_path / "token").write_text("stolen")
    slept: list[float] = []
    reader = PrometheusReader(secured.proxy.url, client=secured.through_proxy(bearer_token_file=str(
        tmp_path / "token")), sleep=slept.append)  # fmt: skip
    with pytest.raises(PrometheusError, match=r"refused the token \(401 Unauthorized\); check "
                                              r"telemetry.prometheusClient.authorization"):  # fmt: skip
        reader.query("up")
    assert slept == []


def test_an_overloaded_prometheus_is_retried_with_backoff_up_to_the_bound(secured):
    secured.proxy.fail_next = 2
    slept: list[float] = []
    reader = PrometheusReader(secured.proxy.url, client=secured.through_proxy(retries=2, backoff=0.1),
                              sleep=slept.append)  # fmt: skip
    assert reader.query("up")  # the third try passes
    assert slept == [0.1, 0.2]
    secured.proxy.fail_next = 3
    slept.clear()
    with pytest.raises(PrometheusError, match=r"unreachable \(3 tries\): HTTP 503"):
        reader.query("up")
    assert slept == [0.1, 0.2]
    secured.proxy.fail_next = 0


def test_the_operator_reads_through_the_policys_client_settings_and_says_why_when_refused(
    env, namespace, unique, secured, tmp_path
):
    """The session's operator, a policy whose telemetry is the token-gated TLS Prometheus: with the
    right token the workload is speculative; with a wrong one it is plain decode, and the check's
    message names the refusal."""
    # The TLS Prometheus scrapes the session's synthetic telemetry, which the pool's nodes report to.
    secured.prometheus.set_targets("session", [env.telemetry.target])
    wrong = tmp_path / "wrong-token"
    wrong.write_text("stolen")
    for token_file, expect in ((secured.files / "token", "speculative"), (wrong, "plain")):
        name = unique("tls-policy")
        client = {"timeoutSeconds": 5, "retries": 1, "authorization": {"credentialsFile": str(token_file)},
                  "tls": {"caFile": str(secured.pki.ca)}}  # fmt: skip
        body = policy(name, secured.proxy.url, telemetry={"prometheusClient": client, "stalenessSeconds": 10})
        server_side_apply(env.api, body, "sovereignspec-e2e")
        check = unique("tls-check")
        params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
        k.apply(env.api, k.admission_check(check, env.controller, params))
        pool = make_pool(replace(env, check=check), namespace, [("H100-SXM", "eu", 2, [0.95, 0.95])],
                         queue=f"q-{expect}")  # fmt: skip
        for host in pool.hosts.values():  # make_pool waits for the session's Prometheus; this one too
            promql = f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname="{host}"}}'
            wait_until(lambda q=promql: len(secured.prometheus.query(q)) >= 2, timeout=30, what=promql)
        time.sleep(1.2)  # the operator reuses a telemetry snapshot for 1 s
        job = f"tls-{expect}"
        submit(pool, job, **CHAT)
        entry = our_entry(pool, decided(pool, job))
        assert entry["state"] == "Ready" and entry["message"].startswith(expect), entry["message"]
        if expect == "plain":
            assert "refused the token (401 Unauthorized)" in entry["message"], entry["message"]


def test_a_query_prometheus_refuses_is_reported_with_its_own_error_and_not_retried(secured):
    slept: list[float] = []
    reader = PrometheusReader(secured.prometheus.url, client=secured.client(), sleep=slept.append)
    with pytest.raises(PrometheusError, match=r"answered bad_data: .*parse error"):
        reader.query("sum(")  # Prometheus answers 400 with its API's error document
    assert slept == []
