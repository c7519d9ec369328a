"""The metrics endpoint behind authentication and authorisation, as controller-runtime's secure
metrics serve it (`filters.WithAuthenticationAndAuthorization`, kubebuilder's default since v4):
HTTPS; a bearer token, checked with a TokenReview; its user allowed `get` on the non-resource URL
`/metrics` by a SubjectAccessReview. No token or an invalid one: 401; a user RBAC does not allow:
403. Answers are cached briefly per token (as kube-rbac-proxy does), so a scrape every few seconds
costs the API server two reviews a minute, and a flood of bad tokens no more than one pair each.

The certificate is the one in `--metrics-cert-dir` (tls.crt, tls.key: a Secret cert-manager keeps,
mounted there), else a self-signed one made at start (controller-runtime does the same); a
ServiceMonitor then skips verification or names the CA.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import logging
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sovereignspec.operator.writer import API_ERRORS

log = logging.getLogger(__name__)

PATH = "/metrics"
ALLOWED_FOR, REFUSED_FOR = 60.0, 10.0  # seconds an answer about a token is reused


class MetricsAuth:
    """Who may read /metrics: the API server's answer about a bearer token, cached briefly."""

    def __init__(self, api: client.ApiClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.clock = clock
        self._cache: dict[str, tuple[int, str, float]] = {}
        self._lock = threading.Lock()

    def _review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.api.call_api(
            *self.api.param_serialize(
                method="POST",
                resource_path=path,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            ),
            _request_timeout=(2.0, 5.0),
        )
        data = resp.read()
        if resp.status >= 400:
            raise client.ApiException(status=resp.status, reason=data.decode(errors="replace")[:200])
        return dict((json.loads(data) or {}).get("status") or {})

    def check(self, authorization: str | None) -> tuple[int, str]:
        """(HTTP status, why) for a request with this Authorization header."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "a bearer token is required"
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        now = self.clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[2] > now:
                return cached[0], cached[1]
        try:
            review = self._review(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token.strip()},
                },
            )
            if not review.get("authenticated"):
                answer = (401, f"the token is not valid: {review.get('error') or 'not authenticated'}")
            else:
                user = review.get("user") or {}
                access = self._review(
                    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                    {
                        "apiVersion": "authorization.k8s.io/v1",
                        "kind": "SubjectAccessReview",
                        "spec": {
                            "user": user.get("username"),
                            "uid": user.get("uid"),
                            "groups": user.get("groups") or [],
                            "extra": user.get("extra") or {},
                            "nonResourceAttributes": {"path": PATH, "verb": "get"},
                        },
                    },
                )
                who = user.get("username", "?")
                answer = (
                    (200, f"{who} may get {PATH}")
                    if access.get("allowed")
                    else (403, f"{who} may not get {PATH} (bind it to the metrics-reader ClusterRole)")
                )
        except API_ERRORS as exc:  # the API server cannot say: nobody gets in, nothing is cached
            log.warning("metrics: could not review a scrape's token: %s", exc)
            return 503, "the API server could not review the token"
        with self._lock:
            if len(self._cache) > 1000:  # tokens are many only in a flood: forget, do not grow
                self._cache.clear()
            self._cache[key] = (*answer, now + (ALLOWED_FOR if answer[0] == 200 else REFUSED_FOR))
        return answer


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for the Pod's own names and loopback, valid for a year (controller-runtime's
    self-signed metrics certificate, in the same spirit)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sovereignspec-metrics")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    crt, pem = folder / "tls.crt", folder / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pem.chmod(0o600)
    return crt, pem


def serve(
    api: client.ApiClient,
    port: int,
    bind: str = "0.0.0.0",
    cert_dir: str | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> ThreadingHTTPServer:
    """Serve `registry` on https://bind:port/metrics to whom the API server allows, in a thread."""
    if cert_dir:
        crt, pem = Path(cert_dir) / "tls.crt", Path(cert_dir) / "tls.key"
    else:
        crt, pem = self_signed(Path(tempfile.mkdtemp(prefix="sovereignspec-metrics-")))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(crt), str(pem))
    auth = MetricsAuth(api)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != PATH:
                self._answer(404, b"not found\n")
                return
            status, why = auth.check(self.headers.get("Authorization"))
            if status != 200:
                self._answer(status, f"{why}\n".encode())
                return
            self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)

        def _answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="sovereignspec-metrics"')
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self) -> tuple[Any, Any]:
            # The TLS handshake in the request's own thread (on its first read), never in the
            # accepting one: a client that stalls mid-handshake holds up only itself.
            sock, addr = self.socket.accept()
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    server = Server((bind, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics-https", daemon=True).start()
    log.info("metrics: https://%s:%d%s, bearer token and RBAC required", bind, port, PATH)
    return server
