"""Read GPU activity, acceptance and TPOT through the Prometheus HTTP API (urllib, no client lib).

A Prometheus as it is deployed: behind TLS with the cluster's or a private CA, a client
certificate, a bearer token (a ServiceAccount's, rotated on disk: read again for every request) or
basic auth, each from a file mounted into the operator's Pod, never inline. Transport failures and
5xx/429 answers are retried a bounded number of times with backoff; a refusal (401/403) or a
certificate that does not verify is not retried and says which setting to look at.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sovereignspec import engines
from sovereignspec.telemetry.snapshot import (
    ACTIVITY_METRICS,
    MIG_LABEL,
    GpuReading,
    Snapshot,
    activity_readings,
    host_of,
    merge_activity,
)


class PrometheusError(RuntimeError):
    pass


# Where each setting is, for messages: the SpeculationPolicy's field names.
SETTING = "telemetry.prometheusClient"


@dataclass(frozen=True)
class ClientConfig:
    """How to reach a Prometheus: files are paths in the operator's Pod (Secrets mounted there)."""

    timeout: float = 3.0
    retries: int = 2  # more tries after the first, on transport errors and 5xx/429 only
    backoff: float = 0.25  # seconds before the first retry, doubled after each
    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None  # else the system's trust store
    cert_file: str | None = None  # a client certificate (with key_file)
    key_file: str | None = None


def _read_secret(path: str, field: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as exc:
        raise PrometheusError(f"{SETTING}.{field} {path}: cannot read it ({exc.strerror or exc})") from exc
    if not text:
        raise PrometheusError(f"{SETTING}.{field} {path}: the file is empty")
    return text


class PrometheusReader:
    def __init__(
        self,
        url: str,
        timeout: float | None = None,
        window: str = "5m",
        engine_options: Mapping[str, Mapping[str, str]] | None = None,
        client: ClientConfig | None = None,
        sleep: Any = time.sleep,
        step_window_s: int = 120,
    ) -> None:
        self.url = url.rstrip("/")
        self.client = client or ClientConfig()
        self.timeout = self.client.timeout if timeout is None else timeout
        self.window = window
        self.step_window_s = step_window_s  # what one step reading averages over (`steps`)
        # Per engine, what the policy says its metrics mean (`Engine.acceptance`).
        self.engine_options = dict(engine_options or {})
        self.rejected: dict[str, int] = {}  # reason -> rows treated as missing, for the metric
        self._sleep = sleep
        self._tls: ssl.SSLContext | None = None

    def _context(self) -> ssl.SSLContext | None:
        c = self.client
        if not self.url.startswith("https:"):
            return None
        if self._tls is None:
            try:
                ctx = ssl.create_default_context(cafile=c.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise PrometheusError(
                    f"{SETTING}.tls.caFile {c.ca_file}: not a CA bundle it can read ({exc})"
                ) from exc
            if c.cert_file or c.key_file:
                try:
                    ctx.load_cert_chain(str(c.cert_file), c.key_file)
                except (OSError, ssl.SSLError) as exc:
                    raise PrometheusError(
                        f"{SETTING}.tls.certFile/keyFile {c.cert_file}, {c.key_file}: not a certificate and "
                        f"key it can read ({exc})"
                    ) from exc
            self._tls = ctx
        return self._tls

    def _headers(self) -> dict[str, str]:
        c = self.client
        headers = {"Accept": "application/json"}
        if c.bearer_token_file:
            token = _read_secret(c.bearer_token_file, "authorization.credentialsFile")
            headers["Authorization"] = f"Bearer {token}"
        elif c.basic_auth_username is not None and c.basic_auth_password_file:
            password = _read_secret(c.basic_auth_password_file, "basicAuth.passwordFile")
            pair = f"{c.basic_auth_username}:{password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return headers

    def _get(self, target: str) -> Any:
        """The JSON answer to one GET: retried on what may pass (a dropped connection, a timeout, an
        overloaded or restarting server), never on what will not (refused credentials, a
        certificate that does not verify)."""
        context = self._context()
        last = ""
        tries = self.client.retries + 1
        for attempt in range(tries):
            if attempt:
                self._sleep(self.client.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(target, headers=self._headers())
            try:
                with urllib.request.urlopen(request, timeout=self.timeout, context=context) as resp:
                    return json.load(resp)
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403):
                    c = self.client
                    if c.bearer_token_file:
                        how, where = "the token", f"{SETTING}.authorization"
                    elif c.basic_auth_username is not None:
                        how, where = "the basic-auth credentials", f"{SETTING}.basicAuth"
                    else:
                        how, where = "a request without credentials", f"{SETTING}.authorization or .basicAuth"
                    raise PrometheusError(
                        f"Prometheus at {self.url} refused {how} ({exc.code} {exc.reason}); check {where}"
                    ) from exc
                if exc.code >= 500 or exc.code == 429:
                    last = f"HTTP {exc.code} {exc.reason}"
                    continue
                try:  # the API's own error (400 bad_data, 422): its JSON says what
                    return json.load(exc)
                except ValueError:
                    raise PrometheusError(f"Prometheus at {self.url} answered HTTP {exc.code}") from exc
            except urllib.error.URLError as exc:
                reason = exc.reason
                if isinstance(reason, ssl.SSLCertVerificationError):
                    raise PrometheusError(
                        f"Prometheus at {self.url}: its certificate does not verify "
                        f"({reason.verify_message}); check {SETTING}.tls.caFile"
                    ) from exc
                if isinstance(reason, ssl.SSLError):
                    why = reason.reason or reason
                    raise PrometheusError(
                        f"Prometheus at {self.url}: TLS failed ({why}); check {SETTING}.tls"
                    ) from exc
                last = str(reason)
            except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate shows at the first read
                why = exc.reason or exc
                raise PrometheusError(
                    f"Prometheus at {self.url}: TLS failed ({why}); check {SETTING}.tls"
                ) from exc
            except (OSError, ValueError) as exc:  # a timeout mid-answer; a body that is not JSON
                last = f"{type(exc).__name__}: {exc}"
        raise PrometheusError(f"Prometheus at {self.url} unreachable ({tries} tries): {last}")

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float, float]]:
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        doc = self._get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params))
        if not isinstance(doc, dict) or doc.get("status") != "success":
            got = doc if not isinstance(doc, dict) else f"{doc.get('errorType')}: {doc.get('error')}"
            raise PrometheusError(f"Prometheus at {self.url} answered {str(got)[:200]}")
        result = (doc.get("data") or {}).get("result") if isinstance(doc.get("data"), dict) else None
        if not isinstance(result, list):
            raise PrometheusError(f"Prometheus at {self.url} answered without data.result: not its API")
        rows = []
        for r in result:  # a row that is not a sample is dropped and counted, never raised
            sample = _sample(r)
            if sample is None:
                self.rejected["malformed"] = self.rejected.get("malformed", 0) + 1
            else:
                rows.append(sample)
        return rows

    def gpu_activity(self) -> dict[tuple[str, int], GpuReading]:
        per_metric = {}
        for name in ACTIVITY_METRICS:
            values = self.query(name)
            stamps = {_key(labels): value for labels, value, _ in self.query(f"timestamp({name})")}
            series = [
                (host_of(labels), labels.get("gpu"), value, stamps.get(_key(labels), at))
                for labels, value, at in values
                if not labels.get(MIG_LABEL)
            ]
            per_metric[name] = activity_readings(name, series, self.rejected)
        return merge_activity(per_metric)

    def acceptance(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(namespace, model) -> (per-token acceptance α, draft tokens in the window).

        Keyed by `namespace`, the label Prometheus sets from service discovery (see
        deploy/prometheus/): with honor_labels off, a series an engine exports with its own
        `namespace` label keeps the target's, so no workload can speak for another namespace. A
        `tenant` label on engine metrics is not evidence of anything and is ignored.

        Each engine's module reads its own counters (`Engine.acceptance`), weighted by the draft
        tokens they count, or with the prior's weight where an engine reports no token counts."""
        by = "namespace, model_name"
        # One evaluation time for every query: increase() extrapolates to the window's edges, so
        # counters read at different instants would not divide into a true ratio.
        return engines.acceptance(self, by, time.time(), self.engine_options)

    def reject(self, reason: str, rows: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + rows

    def tpot(self) -> dict[tuple[str, str], float]:
        """(namespace, owner) -> p90 time per output token over the last two minutes. The owner is
        what Kueue made the Workload for: the Job (its pods' `job_name`); for the pods of a group
        (a StatefulSet's, a LeaderWorkerSet group's) the Workload Kueue built (`workload`); for an
        engine pod of neither (a Deployment's replica, admitted alone), the Pod itself (`pod`).

        The first histogram a workload has, in this order (`engines.tpot_metrics`): the engines'
        per-request TPOT, the names older versions exported, then the per-output-event latencies,
        which overstate per-token latency under speculation (an event carries τ tokens):
        conservative for a neighbour's SLO, never optimistic."""
        out: dict[tuple[str, str], float] = {}
        for metric in engines.tpot_metrics():
            for owner, match in OWNERS:
                rate = f"rate({metric}_bucket{match}[2m])"
                q = f"histogram_quantile(0.9, sum by (le, namespace, {owner}) ({rate}))"
                for labels, value, _ in self.query(q):
                    key = (labels.get("namespace", ""), labels.get(owner, ""))
                    if math.isfinite(value) and value > 0 and key[1] and key not in out:
                        out[key] = value
        return out

    def steps(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(namespace, owner) -> (mean requests running while it ran any, mean seconds per output
        event) over the last `step_window_s` (two minutes), for each workload whose engine reports
        both: in plain decode an output event is one step, so this is a measurement of the GPU's
        step time at that batch. Idle samples (no request running) are left out of the batch's
        mean, as an idle engine records no output events either.

        Owners as `tpot` reads them. A workload with more than one engine's running gauge (two
        engines with the same labels, or a workload of several engines) is left out and counted
        as rejected: one mean over several engines is no engine's step. Rates are of counters, so
        an engine restarted inside the window (its counters reset) reads as Prometheus's rate()
        makes of it: the increase it saw, not a negative step."""
        owners = OWNERS
        w = f"{self.step_window_s}s"
        resolution = f"{max(self.step_window_s // 24, 1)}s"
        step_s: dict[tuple[str, str], float] = {}
        for metric in reversed(engines.tpot_metrics()):  # per event first: one event, one step
            for owner, match in owners:
                by = f"namespace, {owner}"
                q = (f"sum by ({by}) (rate({metric}_sum{match}[{w}])) "
                     f"/ sum by ({by}) (rate({metric}_count{match}[{w}]))")  # fmt: skip
                for labels, value, _ in self.query(q):
                    key = (labels.get("namespace", ""), labels.get(owner, ""))
                    if math.isfinite(value) and value > 0 and key[1] and key not in step_s:
                        step_s[key] = value
        running: dict[tuple[str, str], list[float]] = {}
        for metric in engines.gauges("running"):
            for owner, match in owners:
                busy = f"avg_over_time(({metric}{match} > 0)[{w}:{resolution}])"
                for labels, value, _ in self.query(busy):
                    key = (labels.get("namespace", ""), labels.get(owner, ""))
                    if key[1] and math.isfinite(value):
                        running.setdefault(key, []).append(value)
        out = {}
        for key, values in running.items():
            if len(values) > 1:
                self.reject("several engines for one workload", len(values))
            elif key in step_s and values[0] >= 1.0:
                out[key] = (values[0], step_s[key])
        return out

    def drafting(self) -> dict[tuple[str, str], float]:
        """(namespace, owner) -> draft tokens its engines proposed over the last `step_window_s`
        (the engines' `drafted` counters; owners as `tpot` reads them). Only owners whose engines
        drafted are named: a plain engine's counter stays at 0 or is not exported at all. A
        restart inside the window reads as increase() makes of it: the counts of both lives."""
        return self._by_owner("drafted")

    def drafts(self) -> dict[tuple[str, str], float]:
        """(namespace, owner) -> drafts its engines proposed over the same window as `drafting`
        (with it, the mean draft length)."""
        return self._by_owner("drafts")

    def _by_owner(self, kind: str) -> dict[tuple[str, str], float]:
        """Each owner's increase of every engine's `kind` counters over `step_window_s`."""
        out: dict[tuple[str, str], float] = {}
        for metric in engines.gauges(kind):
            for owner, match in OWNERS:
                q = f"sum by (namespace, {owner}) (increase({metric}{match}[{self.step_window_s}s]))"
                for labels, value, _ in self.query(q):
                    key = (labels.get("namespace", ""), labels.get(owner, ""))
                    if math.isfinite(value) and value > 0 and key[1]:
                        out[key] = out.get(key, 0.0) + value
        return out

    def snapshot(self) -> Snapshot:
        now = time.time()
        try:
            gpus = self.gpu_activity()
        except PrometheusError as exc:
            return Snapshot(fetched_at=now, error=str(exc), rejected=dict(self.rejected))
        errors = []
        acceptance: dict[tuple[str, str], tuple[float, float]] = {}
        tpot: dict[tuple[str, str], float] = {}
        drafting: dict[tuple[str, str], float] = {}
        drafts: dict[tuple[str, str], float] = {}
        try:
            acceptance = self.acceptance()
            tpot = self.tpot()
            drafting, drafts = self.drafting(), self.drafts()
        except PrometheusError as exc:
            errors.append(str(exc))
        rejected, since = dict(self.rejected), now - self.step_window_s
        return Snapshot(
            gpus, acceptance, tpot, now, "; ".join(errors) or None, rejected, drafting, drafts, since
        )


# Who owns an engine's series, as the scrape job's relabelling names them, each with the matcher that
# keeps a series to its first owner: a Job's pods (`job_name`), a group's (`workload`), a pod alone.
OWNERS = (("job_name", ""), ("workload", '{job_name=""}'), ("pod", '{job_name="",workload=""}'))


def _sample(row: object) -> tuple[dict[str, str], float, float] | None:
    """(labels, value, timestamp) of one instant-vector row, or None if it is not one."""
    if not isinstance(row, dict):
        return None
    labels, value = row.get("metric"), row.get("value")
    if not isinstance(labels, dict) or not isinstance(value, list) or len(value) != 2:
        return None
    try:
        at, number = float(value[0]), float(value[1])
    except (TypeError, ValueError):
        return None
    return {str(k): str(v) for k, v in labels.items()}, number, at


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))
