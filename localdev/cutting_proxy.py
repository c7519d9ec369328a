"""A loopback relay in front of the API server that cuts chosen requests mid-flight, or holds them.

It terminates TLS with the API server's own serving certificate (so a client that trusts the
cluster's CA cannot tell it apart), reads each HTTP/1.1 request, and either forwards it to the real
API server or resets the connection once the request has been sent — what a client sees when the
server dies, a load balancer drops it or the network fails between request and response: a
transport error, not an HTTP status. Or it holds a chosen request, read whole, until `release()`,
and then sends it on whether or not its client is still there (keeping the connection to the API
server until it answers): a request on its way from a process that was paused, or has ended, after
it sent it. Responses (watch streams included) are relayed as bytes.

Only the request side is parsed: Kubernetes clients (urllib3, aiohttp) send one request at a time on
a connection, with a Content-Length or chunked body."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localdev.ports import free_port

Cut = Callable[[str, str], bool]  # (method, path without query) -> reset this request?


@dataclass
class CuttingProxy:
    upstream_port: int
    pki: Path  # holds ca.crt, apiserver.crt, apiserver.key
    cut: Cut = field(default=lambda method, path: False)
    cuts: list[tuple[str, str]] = field(default_factory=list)  # what was cut, in order
    hold: Cut = field(default=lambda method, path: False)  # (method, path) -> hold until release()
    held: list[tuple[str, str]] = field(default_factory=list)  # what was held, in order
    sent_late: list[tuple[str, str, int]] = field(default_factory=list)  # held, then sent: the status
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _upstream: ssl.SSLContext | None = None
    _released: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> CuttingProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._released = asyncio.Event()
            serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            serving.load_cert_chain(str(self.pki / "apiserver.crt"), str(self.pki / "apiserver.key"))
            serving.set_alpn_protocols(["http/1.1"])
            # Below the ephemeral range, as every harness port (localdev/ports.py).
            server = await asyncio.start_server(self._relay, "127.0.0.1", free_port(), ssl=serving)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            async with server:
                await server.serve_forever()

        def run() -> None:
            assert self._loop is not None
            self._loop.run_until_complete(_quietly(serve()))

        self._thread = threading.Thread(target=run, name="cutting-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the cutting proxy did not start")
        return self

    def cut_count(self) -> int:
        with self._lock:
            return len(self.cuts)

    def held_count(self) -> int:
        with self._lock:
            return len(self.held)

    def release(self) -> None:
        """Send on every request held so far, and hold none from now on."""
        self.hold = lambda _method, _path: False
        assert self._loop is not None and self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    def close(self) -> None:
        if self._loop is not None:
            for task in asyncio.all_tasks(self._loop):
                self._loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(10)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._upstream is None:  # one TLS context for every connection
            self._upstream = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            self._upstream.set_alpn_protocols(["http/1.1"])
        try:
            up_r, up_w = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port, ssl=self._upstream, server_hostname="127.0.0.1"
            )
        except OSError:
            _reset(client_w)
            return
        answers: list[bytes] = []  # the first bytes of each answer from the API server
        back = asyncio.create_task(_copy(up_r, client_w, answers))
        try:
            while True:
                head = await client_r.readuntil(b"\r\n\r\n")
                method, target = head.split(b" ", 2)[:2]
                path = target.split(b"?", 1)[0].decode()
                headers = _headers(head)
                body = await _body(client_r, headers)
                if self.cut(method.decode(), path):
                    with self._lock:
                        self.cuts.append((method.decode(), path))
                    _reset(client_w)
                    _reset(up_w)
                    return
                if self.hold(method.decode(), path):
                    with self._lock:
                        self.held.append((method.decode(), path))
                    assert self._released is not None
                    await self._released.wait()
                    before = len(answers)
                    up_w.write(head + body)
                    await up_w.drain()
                    for _ in range(300):  # the answer, even with the client gone (30 s at most)
                        if len(answers) > before:
                            break
                        await asyncio.sleep(0.1)
                    status = int(answers[-1].split(b" ", 2)[1]) if len(answers) > before else 0
                    with self._lock:
                        self.sent_late.append((method.decode(), path, status))
                    continue
                up_w.write(head + body)
                await up_w.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
            pass
        finally:
            back.cancel()
            for w in (client_w, up_w):
                if not w.is_closing():
                    w.close()


def _headers(head: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            name, value = line.split(b":", 1)
            out[name.strip().lower().decode()] = value.strip().decode()
    return out


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            parts.append(size_line + await reader.readexactly(size + 2))
            if size == 0:
                return b"".join(parts)
    return await reader.readexactly(int(headers.get("content-length", "0")))


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: list[bytes]) -> None:
    try:
        while chunk := await reader.read(65536):
            if chunk.startswith(b"HTTP/1."):  # an answer's first bytes (one request at a time)
                answers.append(chunk[:64])
            if writer.is_closing():
                continue  # its client is gone: the answer is still read to its end
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    if not writer.is_closing():
        writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (linger 0), as a dying peer does: no TLS close_notify, no FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _quietly(coro: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):  # close() cancels the server: that is the end
        await coro
