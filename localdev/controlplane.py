"""Drive `hack/cluster-up.sh` / `hack/cluster-down.sh` and talk to the control plane they run."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
HACK = REPO / "hack"


def state_dir() -> Path:
    return Path(os.environ.get("SOVEREIGNSPEC_CLUSTER_DIR", REPO / ".cluster"))


def kubeconfig(user: str = "admin") -> Path:
    """`admin` (system:masters), `operator` (sovereignspec-operator) or `kueue` (kueue-manager)."""
    return state_dir() / f"{user}.kubeconfig"


def api_client(user: str = "admin") -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig(user)))


@dataclass(frozen=True)
class Endpoint:
    server: str
    ca: Path
    cert: Path
    key: Path


def endpoint(user: str = "admin") -> Endpoint:
    doc = yaml.safe_load(kubeconfig(user).read_text())
    user_doc = doc["users"][0]["user"]
    cluster = doc["clusters"][0]["cluster"]
    return Endpoint(
        cluster["server"],
        Path(cluster["certificate-authority"]),
        Path(user_doc["client-certificate"]),
        Path(user_doc["client-key"]),
    )


def is_ready() -> bool:
    """The apiserver answers /readyz for the admin user."""
    if not kubeconfig().exists():
        return False
    ep = endpoint()
    ctx = ssl.create_default_context(cafile=str(ep.ca))
    ctx.load_cert_chain(str(ep.cert), str(ep.key))
    try:
        with urllib.request.urlopen(ep.server + "/readyz", context=ctx, timeout=3) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def up() -> None:
    """Start (or reuse) the control plane; raises with the script's own diagnostics on failure."""
    proc = subprocess.run([str(HACK / "cluster-up.sh")], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"hack/cluster-up.sh failed ({proc.returncode}):\n{proc.stderr[-6000:]}")


def down() -> None:
    proc = subprocess.run([str(HACK / "cluster-down.sh")], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"hack/cluster-down.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


@contextmanager
def session(what: str, stop: bool | None = None) -> Iterator[None]:
    """The control plane for one benchmark, and the machine left as the benchmark found it: stopped
    again where `what` started it, left running where it was up already (a developer's `make
    cluster-up`), and the last line printed says which. `stop` overrides (True: a control plane
    restarted with the benchmark's own flags is stopped either way)."""
    started_here = not is_ready()
    up()
    try:
        yield
    finally:
        if stop if stop is not None else started_here:
            down()
            print(f"{what}: stopped the control plane it ran (hack/cluster-down.sh)", flush=True)
        else:
            print(
                f"{what}: left running the control plane that was up before it (stop it: make cluster-down)",
                flush=True,
            )


# Which pin of hack/versions.env names each binary's version (`make binaries` caches NAME-VERSION).
_PINNED_BY = {
    "kubectl": "KUBERNETES_VERSION",
    "kube-apiserver": "KUBERNETES_VERSION",
    "kube-scheduler": "KUBERNETES_VERSION",
    "helm": "HELM_VERSION",
    "versitygw": "VERSITYGW_VERSION",
}


def pinned_binary(name: str) -> Path | None:
    """The binary `make binaries` built for `name` at the version hack/versions.env pins (None
    until it is built), under ${SOVEREIGNSPEC_CACHE:-~/.cache/sovereignspec}/bin as cluster-lib.sh
    puts it."""
    pins = dict(
        line.split("=", 1) for line in (HACK / "versions.env").read_text().splitlines() if "=" in line
    )
    cache = Path(os.environ.get("SOVEREIGNSPEC_CACHE", Path.home() / ".cache/sovereignspec"))
    path = cache / "bin" / f"{name}-{pins[_PINNED_BY[name]].strip()}"
    return path if path.exists() else None


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds: a harness server stopped either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def require_binary(name: str) -> Path:
    path = pinned_binary(name)
    if path is None:
        raise RuntimeError(f"{name} not built yet: run `make binaries`")
    return path


def kubectl(*args: str, stdin: str | None = None, user: str = "admin") -> subprocess.CompletedProcess[str]:
    """The pinned kubectl that `make binaries` builds, against this control plane (raises only
    when it is not built)."""
    return subprocess.run(
        [str(require_binary("kubectl")), "--kubeconfig", str(kubeconfig(user)), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def pids() -> dict[str, int]:
    out = {}
    for path in (state_dir() / "pids").glob("*.pid"):
        out[path.stem] = int(path.read_text().strip())
    return out


def ports() -> dict[str, int]:
    """The ports cluster-lib.sh uses, as it resolves them from the environment."""
    script = f'source "{HACK / "cluster-lib.sh"}"; ' + "; ".join(
        f"echo {name}=${name}"
        for name in (
            "ETCD_PORT",
            "ETCD_PEER_PORT",
            "APISERVER_PORT",
            "KUEUE_HEALTH_PORT",
            "KUEUE_METRICS_PORT",
            "KUEUE_WEBHOOK_PORT",
            "LWS_HEALTH_PORT",
            "LWS_METRICS_PORT",
            "LWS_WEBHOOK_PORT",
        )
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split("=") for line in out.split())}


def _started_at(pid: int) -> str:
    """Field 22 of /proc/PID/stat, as cluster-lib.sh records it beside the PID."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; nobody may have reaped it yet


def restart_apiserver(
    down_seconds: float = 2.0,
    timeout: float = 120.0,
    directory: Path | None = None,
    while_down: Callable[[], None] | None = None,
    ready: Callable[[], bool] | None = None,
) -> None:
    """Stop kube-apiserver (SIGTERM, then SIGKILL) and start it again with the same command line,
    as an upgrade or a crash would: every watch and connection breaks. The PID files are updated,
    so `make cluster-down` stops the new process. `directory`: another control plane's state
    (a member of the local multi-cluster); `while_down` runs while it is stopped (after
    `down_seconds`); `ready` says when it is back (default: /readyz of the local control plane)."""
    restart("kube-apiserver", down_seconds, timeout, directory, while_down, ready or is_ready)


def restart(
    name: str,
    down_seconds: float,
    timeout: float,
    directory: Path | None,
    while_down: Callable[[], None] | None,
    ready: Callable[[], bool],
) -> None:
    """Stop the component `name` that cluster-up.sh started and start it with the same command
    line (see restart_apiserver)."""
    state = directory or state_dir()
    pid_file = state / "pids" / f"{name}.pid"
    pid = int(pid_file.read_text().strip())
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running(pid):
        os.kill(pid, signal.SIGKILL)
    time.sleep(down_seconds)
    if while_down is not None:
        while_down()
    with (state / "logs" / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    pid_file.write_text(f"{proc.pid}\n")
    (state / "pids" / f"{name}.start").write_text(f"{_started_at(proc.pid)}\n")
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not come back (exit {proc.poll()})")
        time.sleep(0.5)
