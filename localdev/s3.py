"""A real S3 server with Object Lock on loopback: Versity's S3 gateway (built by
hack/build-binaries.sh from its Go module) over a POSIX directory of its own, with bucket
versioning (which Object Lock needs) in another.

The harness owns the root account; `bucket(name, locked=True)` makes a bucket as an administrator
would (Object Lock enabled at creation, or not), and `env()` is what a client of it puts in its
environment (the standard AWS variable names).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from minio import Minio

from localdev.controlplane import require_binary, stop_process
from localdev.ports import free_port

ACCESS_KEY = "sovereignspec-test"
SECRET_KEY = "sovereignspec-test-secret"  # a throwaway server's root secret, never a real one


class LocalS3:
    def __init__(self, listen: str = "127.0.0.1") -> None:
        # Loopback, or (make pod-e2e, inside the pod network's namespace) every address there too,
        # for the operator's Pods that reach it on their bridge's address: see `endpoint_on`.
        self.listen = listen
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sovereignspec-s3-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return self.endpoint_on("127.0.0.1")

    def endpoint_on(self, address: str) -> str:
        """Its endpoint at `address` (one it listens on)."""
        return f"http://{address}:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def client(self) -> Minio:
        return Minio(f"127.0.0.1:{self.port}", access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False)

    def start(self) -> LocalS3:
        (self.dir / "root").mkdir(exist_ok=True)
        (self.dir / "versions").mkdir(exist_ok=True)
        env = {**os.environ, "ROOT_ACCESS_KEY_ID": ACCESS_KEY, "ROOT_SECRET_ACCESS_KEY": SECRET_KEY}
        args = [str(require_binary("versitygw")), "--port", f"{self.listen}:{self.port}", "--quiet",
                "posix", "--versioning-dir", str(self.dir / "versions"), str(self.dir / "root")]  # fmt: skip
        with (self.dir / "log").open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"versitygw exited: {(self.dir / 'log').read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"versitygw did not listen on {self.port}")

    def bucket(self, name: str, locked: bool = True) -> str:
        self.client().make_bucket(name, object_lock=locked)
        return name

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
