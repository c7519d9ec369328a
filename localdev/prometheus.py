"""A real Prometheus (Debian's package, extracted by hack/build-binaries.sh) on loopback; or, where
pods are discovered through the API server, Prometheus built from its Go module with Kubernetes
service discovery (Debian's build has none).

The harness writes the scrape configuration, starts the server on a free port, and can rewrite
the targets and reload, stop it, or start it again on the same port (to test outages).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localdev.controlplane import HACK, stop_process
from localdev.ports import free_port


def binary(kubernetes_sd: bool = False) -> Path:
    cache = Path(os.environ.get("SOVEREIGNSPEC_CACHE", Path.home() / ".cache" / "sovereignspec")) / "bin"
    pattern, mode = (
        ("prometheus-kubernetes-sd-*", "prometheus-sd")
        if kubernetes_sd
        else ("prometheus-[0-9]*", "prometheus")
    )
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run([str(HACK / "build-binaries.sh"), mode], check=True, capture_output=True)
        found = sorted(cache.glob(pattern))
    return found[-1]


@dataclass(frozen=True)
class WebSecurity:
    """Prometheus's own web configuration (`--web.config.file`: TLS, client certificates, basic
    auth) and how the harness itself gets through it (its TLS context, its headers)."""

    config: dict[str, Any]
    context: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)


class LocalPrometheus:
    def __init__(
        self,
        scrape_interval: str = "1s",
        kubernetes_sd: bool = False,
        web: WebSecurity | None = None,
        listen: str = "127.0.0.1",
    ) -> None:
        self.binary = binary(kubernetes_sd)
        # Loopback, or (make pod-e2e, inside the pod network's namespace) every address there too,
        # for Pods that reach it on their bridge's address: see `url_on`.
        self.listen = listen
        self.web = web
        self.port = free_port()
        self.scrape_interval = scrape_interval
        self.dir = Path(tempfile.mkdtemp(prefix="sovereignspec-prometheus-"))
        self.targets: dict[str, list[str]] = {}
        self.scrape_configs: dict[str, dict[str, Any]] = {}  # whole jobs, relabelling and all
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_on("127.0.0.1")

    def url_on(self, address: str) -> str:
        """Its URL at `address` (one it listens on)."""
        scheme = "https" if self.web and "tls_server_config" in self.web.config else "http"
        return f"{scheme}://{address}:{self.port}"

    def _open(self, url: str, method: str = "GET", timeout: float = 5) -> Any:
        headers = self.web.headers if self.web else {}
        context = self.web.context if self.web else None
        request = urllib.request.Request(url, method=method, headers=headers)
        return urllib.request.urlopen(request, timeout=timeout, context=context)

    def _write_config(self) -> None:
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in self.targets.items()
            ]
            + list(self.scrape_configs.values()),
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))

    def start(self, timeout: float = 30.0) -> LocalPrometheus:
        self._write_config()
        log = (self.dir / "prometheus.log").open("ab")
        web = []
        if self.web is not None:
            (self.dir / "web.yml").write_text(yaml.safe_dump(self.web.config))
            web = [f"--web.config.file={self.dir / 'web.yml'}"]
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={self.listen}:{self.port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=1h",
                *web,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.dir / 'prometheus.log').read_text()[-3000:]}")
            try:
                with self._open(self.url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def set_targets(self, job: str, targets: list[str]) -> None:
        self.targets[job] = targets
        self._write_config()
        self._reload()

    def add_scrape_config(self, config: dict[str, Any]) -> None:
        """A whole scrape job (its job_name, static_configs, relabel_configs), then a reload."""
        self.scrape_configs[config["job_name"]] = config
        self._write_config()
        self._reload()

    def remove_scrape_config(self, job_name: str) -> None:
        self.scrape_configs.pop(job_name, None)
        self._write_config()
        self._reload()

    def _reload(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._open(self.url + "/-/reload", method="POST").close()

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with self._open(url) as resp:
            doc = json.load(resp)
        return list(doc["data"]["result"])

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
