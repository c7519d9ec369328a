"""kopf registration: thin. Watches only wake the decision loop; every decision is made in
`controller.Controller.tick`, one tick at a time, from a fresh read of the API.

kopf is used without progress storage: handlers are `on.event` only, so kopf never annotates or
finalizes Kueue's objects (they are not ours to touch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from sovereignspec.operator import metrics
from sovereignspec.operator.controller import Controller
from sovereignspec.operator.policy import GROUP, PLURAL, VERSION

log = logging.getLogger("sovereignspec.operator")


class _Runtime:
    """What the handlers share: the controller, the wake-up event, what the probe reports."""

    controller: Controller | None = None
    wake: asyncio.Event | None = None
    state: dict[str, Any] = {"ticks": 0, "last_error": "", "failing_ticks": 0}  # noqa: RUF012 - one per process


# Ticks in a row that failed, whole or in part, before liveness reports unhealthy (a restart may
# clear what a running process cannot: a wedged connection, a stale credential).
UNHEALTHY_AFTER = 5


def configure(controller: Controller) -> None:
    _Runtime.controller = controller


def _poke(**_: Any) -> None:
    if _Runtime.wake is not None:
        _Runtime.wake.set()


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Log kopf in with exactly the credentials the controller's own client uses."""
    assert _Runtime.controller is not None
    cfg = _Runtime.controller.api.configuration
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization") or ""
    scheme, _sep, token = header.rpartition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.peering.standalone = True
    settings.scanning.disabled = True  # no cluster-wide CRD/namespace scans: least privilege
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.networking.request_timeout = 60
    _Runtime.wake = asyncio.Event()
    _Runtime.wake.set()


@kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads")
def workload_event(event: kopf.RawEvent, **_: Any) -> None:
    status = (event.get("object") or {}).get("status") or {}
    if event.get("type") != "DELETED" and status.get("admissionChecks"):
        _poke()


@kopf.on.event("kueue.x-k8s.io", "v1beta2", "admissionchecks")
def admission_check_event(**_: Any) -> None:
    _poke()


@kopf.on.event(GROUP, VERSION, PLURAL)
def policy_event(**_: Any) -> None:
    _poke()


@kopf.on.event("", "v1", "nodes")
def node_event(event: kopf.RawEvent, **_: Any) -> None:
    if event.get("type") in ("ADDED", "DELETED"):
        _poke()


@kopf.on.probe(id="decisions")
def probe(**_: Any) -> dict[str, Any]:
    state = dict(_Runtime.state)
    if state["failing_ticks"] >= UNHEALTHY_AFTER:
        raise kopf.PermanentError(f"{state['failing_ticks']} ticks in a row failed: {state['last_error']}")
    return state


def _run_tick() -> Any:
    assert _Runtime.controller is not None
    return _Runtime.controller.tick()


@kopf.on.startup()
async def start_loop(memo: kopf.Memo, **_: Any) -> None:
    memo.loop_task = asyncio.create_task(decision_loop())


async def decision_loop() -> None:
    """Wait for a poke or the re-evaluation period, debounce briefly, run one tick in a thread."""
    wake, state = _Runtime.wake, _Runtime.state
    assert wake is not None
    period = 10.0
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=period)
        await asyncio.sleep(0.05)  # gather a burst into one tick
        wake.clear()
        try:
            report = await asyncio.to_thread(_run_tick)
            state["ticks"] += 1
            if report.failures:
                state["failing_ticks"] += 1
                state["last_error"] = "; ".join(report.failures)
            else:
                state["failing_ticks"] = 0
                state["last_error"] = ""
            period = report.reevaluate_after
            if report.more or report.conflicts:
                wake.set()
        except Exception as exc:  # a tick must never kill the loop
            state["failing_ticks"] += 1
            state["last_error"] = f"{type(exc).__name__}: {exc}"
            metrics.TICK_FAILURES.labels(part="tick").inc()
            log.exception("decision tick failed; retrying")
            await asyncio.sleep(1.0)
            wake.set()
