"""cluster-up / cluster-down as a user runs them, on a second set of ports and a separate state
directory so that the session's shared control plane is not disturbed."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localdev import controlplane

HACK = controlplane.HACK
ALT_PORTS = {
    "SOVEREIGNSPEC_ETCD_PORT": "23890",
    "SOVEREIGNSPEC_ETCD_PEER_PORT": "23900",
    "SOVEREIGNSPEC_APISERVER_PORT": "16543",
    "SOVEREIGNSPEC_KUEUE_HEALTH_PORT": "18181",
    "SOVEREIGNSPEC_KUEUE_METRICS_PORT": "18543",
    "SOVEREIGNSPEC_KUEUE_WEBHOOK_PORT": "19543",
    "SOVEREIGNSPEC_LWS_HEALTH_PORT": "18182",
    "SOVEREIGNSPEC_LWS_METRICS_PORT": "18544",
    "SOVEREIGNSPEC_LWS_WEBHOOK_PORT": "19544",
}


@pytest.fixture
def alt_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **ALT_PORTS, "SOVEREIGNSPEC_CLUSTER_DIR": str(tmp_path / "cluster")}


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HACK / script)], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_cluster_up_then_down_leaves_no_process_and_no_listening_port(alt_env, control_plane):
    up = _run("cluster-up.sh", alt_env)
    assert up.returncode == 0, up.stderr[-3000:]
    assert "kubeconfig" in up.stdout and alt_env["SOVEREIGNSPEC_CLUSTER_DIR"] in up.stdout
    state = Path(alt_env["SOVEREIGNSPEC_CLUSTER_DIR"])
    pids = {p.stem: int(p.read_text()) for p in (state / "pids").glob("*.pid")}
    assert set(pids) == {"etcd", "kube-apiserver", "kueue", "lws", "kube-controller-manager"}
    assert all(_running(pid) for pid in pids.values())
    ports = [int(v) for v in ALT_PORTS.values() if not v.startswith("239")] + [
        int(ALT_PORTS["SOVEREIGNSPEC_ETCD_PORT"])
    ]
    assert all(_listening(p) for p in ports)

    again = _run("cluster-up.sh", alt_env)  # idempotent: reuses what runs
    assert again.returncode == 0 and "already up" in again.stderr

    down = _run("cluster-down.sh", alt_env)
    assert down.returncode == 0, down.stderr
    assert not any(_running(pid) for pid in pids.values())
    assert not any(_listening(int(p)) for p in ALT_PORTS.values())
    assert not state.exists()


def test_a_port_in_use_is_reported_and_nothing_is_left_running(alt_env, control_plane):
    port = int(ALT_PORTS["SOVEREIGNSPEC_APISERVER_PORT"])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        result = _run("cluster-up.sh", alt_env)
    assert result.returncode != 0
    assert f"port {port} (kube-apiserver) is already in use" in result.stderr
    assert not any(_listening(int(p)) for name, p in ALT_PORTS.items() if "APISERVER" not in name)


def test_rbac_is_enforced_for_a_user_without_bindings(api):
    operator = controlplane.api_client("operator")  # sovereignspec-operator: no RBAC granted here
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(operator).list_secret_for_all_namespaces()
    assert err.value.status == 403
    assert client.CoreV1Api(api).list_namespace().items  # admin may


def test_the_shared_control_plane_reports_ready_and_its_kubeconfig(control_plane):
    assert controlplane.is_ready()
    assert controlplane.kubeconfig().exists()
