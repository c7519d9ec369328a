"""The metrics endpoint behind authentication and authorisation, as controller-runtime's secure
metrics serve it (`filters.WithAuthenticationAndAuthorization`, kubebuilder's default since v4):
HTTPS; a bearer token, checked with a TokenReview; its user allowed `get` on the non-resource URL
`/metrics` by a SubjectAccessReview. No token or an invalid one: 401; a user RBAC does not allow:
403. Answers are cached briefly per token (as kube-rbac-proxy does), so a scrape every few seconds
costs the API server two reviews a minute, and a flood of bad tokens no more than one pair each.

The endpoint faces whoever reaches its port, so it is bounded: at most MAX_CONNECTIONS open at
once, each given IDLE_SECONDS to finish its handshake and send its request (a client that stalls
is closed, and when all are taken the longest-waiting one that has not yet sent its request makes
room); at most MAX_REVIEWS token reviews in flight; the answers about refused tokens kept in a
bounded table that never evicts an allowed one. A scrape whose token is allowed is answered from
the cache whatever else is connected. A dropped client is one log line, never a traceback.

The certificate is the one in `--metrics-cert-dir` (tls.crt, tls.key: a Secret cert-manager keeps,
mounted there), else a self-signed one made at start (controller-runtime does the same); a
ServiceMonitor then skips verification or names the CA.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import json
import logging
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sovereignspec.operator.runtime.writer import API_ERRORS

log = logging.getLogger(__name__)

PATH = "/metrics"
ALLOWED_FOR, REFUSED_FOR = 60.0, 10.0  # seconds an answer about a token is reused
MAX_CONNECTIONS = 128
IDLE_SECONDS = 10.0  # to finish the TLS handshake and send the request, and per read or write
MAX_REVIEWS = 4  # TokenReviews (and their SubjectAccessReviews) in flight at once
REVIEW_WAIT = 2.0  # seconds a request waits for a review slot before a 503
MAX_ALLOWED, MAX_REFUSED = 256, 4096  # tokens whose answers are kept


class MetricsAuth:
    """Who may read /metrics: the API server's answer about a bearer token, cached briefly."""

    def __init__(self, api: client.ApiClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.clock = clock
        # Allowed tokens apart from refused ones: a flood of bogus tokens evicts only its own kind.
        self._allowed: OrderedDict[str, tuple[int, str, float]] = OrderedDict()
        self._refused: OrderedDict[str, tuple[int, str, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._reviews = threading.BoundedSemaphore(MAX_REVIEWS)

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
            cached = self._allowed.get(key) or self._refused.get(key)
            if cached is not None and cached[2] > now:
                return cached[0], cached[1]
        if not self._reviews.acquire(timeout=REVIEW_WAIT):
            return 503, "too many token reviews in flight; try again"
        try:
            answer = self._ask(token.strip())
        finally:
            self._reviews.release()
        if answer[0] == 503:
            return answer
        with self._lock:
            table, bound = (self._allowed, MAX_ALLOWED) if answer[0] == 200 else (self._refused, MAX_REFUSED)
            table[key] = (*answer, now + (ALLOWED_FOR if answer[0] == 200 else REFUSED_FOR))
            table.move_to_end(key)
            while len(table) > bound:  # the oldest first: a flood forgets its own, not the rest
                table.popitem(last=False)
        return answer

    def _ask(self, token: str) -> tuple[int, str]:
        """The API server's answer about `token`: a TokenReview, then a SubjectAccessReview."""
        try:
            review = self._review(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token},
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


def _cut(sock: Any) -> None:
    with contextlib.suppress(OSError):  # already gone
        sock.shutdown(socket.SHUT_RDWR)


class DropLog:
    """Dropped clients as log lines: the first at once, then at most one a second saying how many
    more there were (a flood of stalled connections writes a handful of lines, not thousands)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._last = -1e9
        self._since = 0
        self.total = 0

    def note(self, client: Any, why: str) -> None:
        with self._lock:
            self.total += 1
            now = self.clock()
            if now - self._last < 1.0:
                self._since += 1
                return
            more, self._since, self._last = self._since, 0, now
        who = f"{client[0]}:{client[1]}" if isinstance(client, tuple) and len(client) >= 2 else "a client"
        extra = f" (and {more} more since the last such line)" if more else ""
        log.info("metrics: dropped %s: %s%s", who, why, extra)


class _Handler(BaseHTTPRequestHandler):
    timeout = IDLE_SECONDS  # per read and write: a client that stalls is dropped
    server: _Server

    def do_GET(self) -> None:
        self.server.serving(self.request)  # its request is in: no longer one to make room from
        if self.path.split("?", 1)[0] != PATH:
            self._answer(404, b"not found\n")
            return
        status, why = self.server.auth.check(self.headers.get("Authorization"))
        if status != 200:
            self._answer(status, f"{why}\n".encode())
            return
        self._answer(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        context: ssl.SSLContext,
        auth: MetricsAuth,
        registry: CollectorRegistry,
    ) -> None:
        super().__init__(address, _Handler)
        self.context, self.auth, self.registry = context, auth, registry
        self._guard = threading.Lock()
        self._open: dict[Any, tuple[float, bool]] = {}  # connection -> (opened, request in)
        self._drops = DropLog()

    def get_request(self) -> tuple[Any, Any]:
        # The TLS handshake in the request's own thread (on its first read), never in the
        # accepting one: a client that stalls mid-handshake holds up only itself, and only
        # until its timeout.
        sock, addr = self.socket.accept()
        sock.settimeout(IDLE_SECONDS)
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            if len(self._open) >= MAX_CONNECTIONS:
                waiting = [(opened, c) for c, (opened, busy) in self._open.items() if not busy]
                if not waiting:  # every connection is being answered: this one waits its turn
                    self._drops.note(client_address, "too many connections")
                    self.shutdown_request(request)
                    return
                oldest = min(waiting, key=lambda w: w[0])[1]
                self._open.pop(oldest)
                _cut(oldest)  # its thread's read fails at once and ends
                self._drops.note(None, "made room: the longest-waiting connection without a request")
            self._open[request] = (time.monotonic(), False)
        super().process_request(request, client_address)

    def serving(self, request: Any) -> None:
        with self._guard:
            if request in self._open:
                self._open[request] = (self._open[request][0], True)

    def shutdown_request(self, request: Any) -> None:
        with self._guard:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that stalled, reset or spoke no TLS: one line, not a traceback.
        exc = sys.exc_info()[1]
        self._drops.note(client_address, f"{type(exc).__name__}: {exc}" if exc else "dropped")


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
    server = _Server((bind, port), context, MetricsAuth(api), registry)
    threading.Thread(target=server.serve_forever, name="metrics-https", daemon=True).start()
    log.info("metrics: https://%s:%d%s, bearer token and RBAC required", bind, port, PATH)
    return server
