"""A request that fails below the API's answer (a connection closed mid-request, as an API server
shutting down does) fails that one write: the Event is lost and counted, the status write is an
error for that workload, decided again next tick; nothing escapes to abort the pass. Against a real
socket on loopback that reads each request and hangs up without answering."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from sovereignspec.operator.decision.plan import EventNote, Write
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.writer import Writer
from sovereignspec.profiles import load_profiles


@pytest.fixture
def hangs_up() -> Iterator[client.ApiClient]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))  # bound here and held: no other process can take the port
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(65536)  # the request, then no answer at all

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.getsockname()[1]}"
    config.retries = 1
    try:
        yield client.ApiClient(config)
    finally:
        stop.set()
        thread.join(5)
        server.close()


WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {"name": "chat", "namespace": "team-a", "uid": "u1", "resourceVersion": "7"},
}


def _failures(part: str) -> float:
    return metrics.TICK_FAILURES.labels(part=part)._value.get()


def test_an_event_lost_to_a_transport_error_is_counted_and_nothing_is_raised(hangs_up) -> None:
    before = _failures("event")
    Writer(hangs_up, "sovereignspec").event(WORKLOAD, "Workload", "PlainDecode", "plain on n/gpu0")
    assert _failures("event") == before + 1


def test_a_status_write_lost_to_a_transport_error_fails_that_workload_alone(hangs_up) -> None:
    controller = Controller(hangs_up, load_profiles())
    write = Write(
        "team-a/chat",
        WORKLOAD,
        "sovereignspec",
        {"name": "sovereignspec", "state": "Pending"},
        "Ready",
        "plain on n/gpu0",
        events=[EventNote("PlainDecode", "plain on n/gpu0")],
        outcome="placed",
    )
    before = _failures("write")
    assert controller._write(write) == "error"
    assert _failures("write") == before + 1
