"""kopf registration: thin. kopf runs the process (login, start-up, liveness); the controller's
own watch-fed caches (informer.py) only wake the decision loop, and every decision is made in
the role's tick (`controller.Controller`, `dispatcher.DispatchController`), one tick at a time,
from those caches.

kopf registers no resource handlers, so it never annotates or finalizes Kueue's objects (they are
not ours to touch) and keeps no per-object state of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from sovereignspec.operator import metrics
from sovereignspec.operator.role import Role

log = logging.getLogger("sovereignspec.operator")


class _Runtime:
    """What the handlers share: the controller, the wake-up event, what the probe reports."""

    controller: Role | None = None
    wake: asyncio.Event | None = None
    state: dict[str, Any] = {"ticks": 0, "last_error": "", "failing_ticks": 0}  # noqa: RUF012 - one per process


# Ticks in a row that failed, whole or in part, before liveness reports unhealthy (a restart may
# clear what a running process cannot: a wedged connection, a stale credential).
UNHEALTHY_AFTER = 5


def configure(controller: Role) -> None:
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


@kopf.on.probe(id="decisions")
def probe(**_: Any) -> dict[str, Any]:
    state = dict(_Runtime.state)
    if _Runtime.controller is not None:
        cache = _Runtime.controller.cache
        state["cache"] = {
            i.name: {"objects": len(i), "lists": i.lists, "synced": i.synced.is_set()} for i in cache.all
        }
    if state["failing_ticks"] >= UNHEALTHY_AFTER:
        raise kopf.PermanentError(f"{state['failing_ticks']} ticks in a row failed: {state['last_error']}")
    return state


def _run_tick() -> Any:
    assert _Runtime.controller is not None
    return _Runtime.controller.tick()


@kopf.on.startup()
async def start_loop(memo: kopf.Memo, **_: Any) -> None:
    assert _Runtime.controller is not None
    loop = asyncio.get_running_loop()

    def wake_from_a_watch() -> None:  # informers run in threads; the loop is asyncio's
        loop.call_soon_threadsafe(_poke)

    _Runtime.controller.cache.on_wake = wake_from_a_watch
    _Runtime.controller.cache.start()
    memo.loop_task = asyncio.create_task(decision_loop())


@kopf.on.cleanup()
async def stop_caches(**_: Any) -> None:
    if _Runtime.controller is not None:
        _Runtime.controller.cache.stop()


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
