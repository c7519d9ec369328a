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
import threading
from typing import Any

import kopf

from sovereignspec.operator.roles.audit import leader_fact
from sovereignspec.operator.roles.role import Role
from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.leader import LeaderElector
from sovereignspec.operator.runtime.writer import now_rfc3339

log = logging.getLogger("sovereignspec.operator")


class _Runtime:
    """What the handlers share: the controller, the wake-up event, what the probe reports."""

    controller: Role | None = None
    elector: LeaderElector | None = None  # None: no leader election, this process always decides
    caught_up = False  # since it last became leader, its caches have caught up with the API server
    lost = threading.Event()  # set: leadership lost, the process exits non-zero
    stop: asyncio.Event | None = None  # kopf's stop flag, on kopf's own loop
    wake: asyncio.Event | None = None
    state: dict[str, Any] = {"ticks": 0, "last_error": "", "failing_ticks": 0}  # noqa: RUF012 - one per process


# Ticks in a row that failed, whole or in part, before liveness reports unhealthy (a restart may
# clear what a running process cannot: a wedged connection, a stale credential).
UNHEALTHY_AFTER = 5
# A new leader's first tick places this many workloads at most; the rest come in the next tick, at
# once. The first decision after a failover then waits for a few to be planned, recorded and
# written, not for all its predecessor left pending (`make bench-failover`, docs/failover.md). A
# batch's writes go out together (`Role.send`) and on a loaded API server end together: 16 took
# 2.4 s at 5,000 workloads, so the first batch is no larger than the write pool's one wave.
FIRST_BATCH = 4


def configure(controller: Role, elector: LeaderElector | None = None) -> None:
    _Runtime.controller = controller
    _Runtime.elector = elector
    if elector is not None:
        controller.writer.fence = elector.fence  # every write refused unless this replica leads
        controller.writer.announce = elector.announce  # every batch of decisions named in the Lease first


async def operate(**kopf_options: Any) -> None:
    """kopf's operator on the running loop, stopped by SIGTERM/SIGINT or by leadership lost.

    The stop flag is an asyncio.Event on this loop, not a threading.Event: kopf waits for a thread
    flag in a default-executor thread that nothing wakes on SIGTERM, and the loop's shutdown joins
    that thread, so the process would hang until the kubelet's SIGKILL (every rolling update, drain
    and rollback a whole grace period long)."""
    _Runtime.stop = asyncio.Event()
    await kopf.operator(stop_flag=_Runtime.stop, **kopf_options)


def lost_leadership() -> bool:
    return _Runtime.lost.is_set()


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
def probe(**_: Any) -> str:
    """ok, or an error (kopf's endpoint then answers 500 with no detail): all the liveness endpoint
    says. It answers whoever reaches its port, so it names no leader, cache or error; the log says
    why this process is unhealthy, and /metrics (behind its token) what it holds."""
    failing, last_error = _Runtime.state["failing_ticks"], _Runtime.state["last_error"]
    if failing >= UNHEALTHY_AFTER:
        log.error("liveness: unhealthy, %d ticks in a row failed; the last: %s", failing, last_error)
        raise kopf.PermanentError("unhealthy")
    return "ok"


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
    # A standby keeps its caches warm too: it takes over without a LIST of every resource.
    _Runtime.controller.cache.start()
    elector = _Runtime.elector
    if elector is not None:

        def leading_now() -> None:
            _Runtime.caught_up = False
            wake_from_a_watch()

        def lost() -> None:  # stop the process: a fresh one rejoins as a standby
            _Runtime.lost.set()
            if _Runtime.stop is not None:
                loop.call_soon_threadsafe(_Runtime.stop.set)  # the elector's thread, kopf's loop

        elector.on_started_leading = leading_now
        elector.on_stopped_leading = lost
        elector.start()
    memo.loop_task = asyncio.create_task(decision_loop())


@kopf.on.cleanup()
async def stop_caches(memo: kopf.Memo, **_: Any) -> None:
    # kopf waits 5 s for the tasks it did not start before it cancels them: ours, and its own
    # waiter of the stop flag after a signal stopped it. Neither is left waiting.
    loop_task = getattr(memo, "loop_task", None)
    if loop_task is not None:  # no tick after this one
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop_task
    if _Runtime.stop is not None:
        _Runtime.stop.set()
    if _Runtime.elector is not None:
        # Hand the Lease over once the writes in flight have ended: the standby need not wait out
        # the lease duration (a Pod deleted, a rolling update).
        await asyncio.to_thread(_Runtime.elector.release)
    if _Runtime.controller is not None:
        _Runtime.controller.cache.stop()


def _catch_up() -> None:
    """A new leader's first step: its Workloads cache at least as new as the API server's state
    now, then every workload a predecessor could still be deciding sealed (`Role.seal`): those the
    Lease it took names (`LeaderElector.inherited`), or, where it names none, every pending one."""
    assert _Runtime.controller is not None and _Runtime.elector is not None
    listed = _Runtime.controller.cache.workloads.catch_up()
    log.info(
        "leading: the Workloads' cache caught up with the API server%s", " (listed again)" if listed else ""
    )
    term, inherited = _Runtime.elector.term(), _Runtime.elector.inherited
    sealed = _Runtime.controller.seal(term, inherited)
    _Runtime.controller.first_batch = FIRST_BATCH
    named_count = None if inherited is None else len(inherited)
    named = "every pending one: the Lease named none" if inherited is None else f"of {named_count} named"
    log.info("leading: %d pending workload(s) sealed for %s before its first decision (%s)", sealed, term,
             named)  # fmt: skip
    audit = getattr(_Runtime.controller, "audit", None)  # both roles keep a record
    if audit is not None:  # the hand-over in the record, ahead of this leader's decisions
        audit.add([leader_fact(audit.writer, term, sealed, named_count, now_rfc3339())])


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
        elector = _Runtime.elector
        if elector is not None and not elector.leading():
            continue  # a standby: woken again when it leads
        try:
            if elector is not None and not _Runtime.caught_up:
                await asyncio.to_thread(_catch_up)
                _Runtime.caught_up = True
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
