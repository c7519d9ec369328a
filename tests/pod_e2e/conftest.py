"""The pod end-to-end test (marker `pod_e2e`, `make pod-e2e`): SovereignSpec as users run it.

A control plane of its own (other ports, its own state directory, the ServiceAccount admission
plugin on), one real node (containerd, kubelet, scheduler, controller-manager: hack/pod-e2e/), the
operator image built from the unchanged Dockerfile and installed with `helm install`. The node and
control plane are torn down at the end of the session, and the teardown must leave nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from localdev import controlplane
from tests.engine import env as engine_setup

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
# Fixed ports all below the ephemeral range (32768-60999): a client connection never takes one.
PORTS = {"ETCD_PORT": 27790, "ETCD_PEER_PORT": 27800, "APISERVER_PORT": 26443, "KUEUE_HEALTH_PORT": 28081,
         "KUEUE_METRICS_PORT": 28443, "KUEUE_WEBHOOK_PORT": 29443, "LWS_HEALTH_PORT": 28082,
         "LWS_METRICS_PORT": 28444, "LWS_WEBHOOK_PORT": 29444}  # fmt: skip


def control_plane(directory: str, shift: int = 0) -> dict[str, str]:
    """hack/cluster-up.sh's environment for a control plane in `directory`, its ports `shift` up."""
    return {"SOVEREIGNSPEC_CLUSTER_DIR": str(REPO / directory),
            **{f"SOVEREIGNSPEC_{name}": str(port + shift) for name, port in PORTS.items()}}  # fmt: skip


E2E = {
    **control_plane(".cluster-pod-e2e"),
    "SOVEREIGNSPEC_WITH_NODE": "1",
    "E2E_APISERVER_PORT": str(PORTS["APISERVER_PORT"]),
    "E2E_PYTHON": sys.executable,
}
# The control plane is also a MultiKueue manager whose dispatcher is SovereignSpec's (the chart
# installed with role=dispatcher, test_pod_e2e.py's last test); the worker-role tests use no
# MultiKueue check, so this changes nothing for them.
MANAGER_KUEUE = "multiKueue:\n  dispatcherName: sovereignspec.io/dispatcher\n  gcInterval: 30s\n"
# A worker control plane for that test (no node): its own state directory, its ports 5 up.
WORKER = control_plane(".cluster-pod-e2e-worker", shift=5)
NODE = "127.0.0.1"
# The operator image is tagged as the chart's default (repository and appVersion), so that the
# chart installs with its defaults; the node has it already and IfNotPresent never pulls.
OPERATOR_IMAGE = "ghcr.io/sovereignspec/sovereignspec:0.1.0"
SERVING_IMAGE = "localhost/sovereignspec-serving-standin:e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/pod_e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.pod_e2e)
            # The session fixture builds the node and the images on a fresh machine (tens of
            # minutes, each step under its own subprocess timeout): the per-test limit is for the
            # test itself.
            item.add_marker(pytest.mark.timeout(600, func_only=True))


# The tests run inside the pod network's namespace (hack/pod-e2e/netns.sh, `make pod-e2e`): its
# bridge's address is where the Pods reach the API servers and Prometheus.
GATEWAY = os.environ.get("SOVEREIGNSPEC_POD_GATEWAY", "")
HOST_NETNS = os.environ.get("SOVEREIGNSPEC_HOST_NETNS", "")


def run(*cmd: str, env: dict[str, str] | None = None, timeout: float = 1800, host: bool = False) -> str:
    """`cmd`, failing with its output; `host`: in the machine's own network namespace (the steps
    that reach the package registries: Debian packages, Go modules, wheels for the images)."""
    if host and HOST_NETNS:
        cmd = ("nsenter", f"--net={HOST_NETNS}", "--", *cmd)
    proc = subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc.stdout


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[client.ApiClient]:
    """Images built offline, control plane and node up; everything torn down (leak-checked) after."""
    if not (GATEWAY and HOST_NETNS):
        pytest.fail("the pod end-to-end tests run inside the pod network's namespace: `make pod-e2e` "
                    "(hack/pod-e2e/netns.sh hack/pytest.sh tests/pod_e2e -m pod_e2e)")  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        for k, v in E2E.items():
            mp.setenv(k, v)
        images = Path(tempfile.mkdtemp(prefix="sovereignspec-e2e-images-"))
        # The operator image from a source tree (default: this one; SOVEREIGNSPEC_E2E_SOURCE builds
        # another, e.g. an older commit, with the same tag).
        source = os.environ.get("SOVEREIGNSPEC_E2E_SOURCE", str(REPO))
        run(str(HACK / "pod-e2e/packages.sh"), host=True)
        run(str(HACK / "build-binaries.sh"), "node", host=True)
        # Prometheus with Kubernetes service discovery: pods found through the API server.
        run(str(HACK / "build-binaries.sh"), "prometheus-sd", host=True)
        # The sovereignty record's bucket: an S3 server with Object Lock on the pod network.
        run(str(HACK / "build-binaries.sh"), "versitygw", host=True)
        run(str(HACK / "pod-e2e/images.sh"), "pause", host=True)
        build = {"OPERATOR_IMAGE": OPERATOR_IMAGE, "CONTEXT": source, "DOCKERFILE": f"{source}/Dockerfile"}
        run(str(HACK / "pod-e2e/images.sh"), "operator", env=build, host=True)
        run(str(HACK / "pod-e2e/images.sh"), "serving", env={"SERVING_IMAGE": SERVING_IMAGE}, host=True)
        archives = []
        for name, image in (("pause", "registry.k8s.io/pause:3.10.2"), ("operator", OPERATOR_IMAGE),
                            ("serving", SERVING_IMAGE)):  # fmt: skip
            archives.append(str(images / f"{name}.tar"))
            run(str(HACK / "pod-e2e/images.sh"), "archive", image, archives[-1])
        down = str(HACK / "pod-e2e/node-down.sh")
        subprocess.run([down], capture_output=True, check=False)  # whatever an earlier run left
        extra = images / "kueue-manager.yaml"
        extra.write_text(MANAGER_KUEUE)
        try:
            run(str(HACK / "cluster-up.sh"), env={"SOVEREIGNSPEC_KUEUE_CONFIG_EXTRA": str(extra)})
            run(str(HACK / "pod-e2e/node-up.sh"), env={"IMAGES": " ".join(archives)})
            yield controlplane.api_client()
        finally:
            for a in archives:
                Path(a).unlink(missing_ok=True)
            extra.unlink(missing_ok=True)
            images.rmdir()
            teardown = subprocess.run([down], capture_output=True, text=True, check=False)
            leftovers = _our_processes()
            if teardown.returncode != 0 or leftovers:
                pytest.fail(f"teardown left things behind: {leftovers}\n{teardown.stderr[-3000:]}")


def _our_processes() -> list[str]:
    """Processes still running a binary from the cache's bin folder (kubelet, containerd, ...)."""
    cache = os.environ.get("SOVEREIGNSPEC_CACHE", str(Path.home() / ".cache/sovereignspec"))
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            exe = os.readlink(proc / "exe")
        except OSError:
            continue
        state = E2E["SOVEREIGNSPEC_CLUSTER_DIR"]
        cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        if exe.startswith(f"{cache}/bin/") and state in cmdline:
            out.append(f"{proc.name} {exe}")
    return out


@dataclass(frozen=True)
class RealEngine:
    """vLLM's CPU build as the node holds it for a serving Pod: the engine's virtualenv, the interpreter
    it was made from (where that is not the system's own) and the tiny checkpoints, all read-only
    host paths that stand in for an engine image and a model volume."""

    venv: Path
    interpreter: Path | None  # the venv's base prefix, mounted at the same path; None: the system's
    models: Path
    libraries: tuple[Path, ...]  # host libraries the engine's extensions link that the image lacks


# Libraries vLLM's CPU extension links beyond glibc and what the serving image's Debian base holds.
EXTRA_LIBRARIES = ("libnuma.so.1",)


@pytest.fixture(scope="session")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> RealEngine:
    try:
        python = engine_setup.install()
    except RuntimeError as e:
        pytest.fail(str(e))
    venv = python.parent.parent
    cfg = dict(
        line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line
    )
    prefix = Path(cfg["home"]).parent
    interpreter = None if str(prefix) in ("/usr", "/usr/local") else prefix
    models = engine_setup.build_tiny(python, tmp_path_factory.mktemp("pod-models"))
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    libraries = tuple(
        Path(line.rsplit(" => ", 1)[1])
        for line in found.splitlines()
        if " => " in line and line.split()[0] in EXTRA_LIBRARIES and "x86-64" in line
    )
    return RealEngine(venv, interpreter, models, libraries)
