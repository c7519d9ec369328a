"""A bearer-token gate in front of a Prometheus, on loopback over TLS: what kube-rbac-proxy or an
OAuth proxy does for a managed or in-cluster Prometheus (Prometheus's own web configuration has
TLS, client certificates and basic auth, but no bearer tokens).

It accepts a request only with `Authorization: Bearer <token>` for the token its file holds now
(rotate it by rewriting the file), answers 401 otherwise, can answer 503 to the next N requests (an
overloaded or restarting Prometheus), and forwards the rest to the upstream Prometheus as a client
of its own (its CA, a client certificate)."""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from localdev.ports import free_port


@dataclass
class TokenProxy:
    upstream: str  # the Prometheus's URL
    token_file: Path  # the one token accepted, read for every request
    cert: Path  # this proxy's serving certificate and key
    key: Path
    upstream_context: ssl.SSLContext | None = None
    upstream_headers: dict[str, str] = field(default_factory=dict)  # its own credentials upstream
    fail_next: int = 0  # answer 503 to this many requests first
    seen: list[str] = field(default_factory=list)  # the Authorization headers, in order
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TokenProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                header = self.headers.get("Authorization", "")
                with proxy._lock:
                    proxy.seen.append(header)
                    failing = proxy.fail_next > 0
                    proxy.fail_next -= 1 if failing else 0
                if failing:
                    self._answer(503, b"upstream overloaded")
                    return
                if header != f"Bearer {proxy.token_file.read_text().strip()}":
                    self._answer(401, b"Unauthorized")
                    return
                try:
                    forward = urllib.request.Request(
                        proxy.upstream + self.path, headers=proxy.upstream_headers
                    )
                    with urllib.request.urlopen(forward, timeout=10, context=proxy.upstream_context) as resp:
                        self._answer(resp.status, resp.read(), resp.headers.get("Content-Type"))
                except urllib.error.HTTPError as exc:
                    self._answer(exc.code, exc.read(), exc.headers.get("Content-Type"))

            def _answer(self, code: int, body: bytes, content_type: str | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type or "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.cert), str(self.key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, name="token-proxy", daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
