"""`sovereignspec audit`: what a regulator receives from the sovereignty record (kept in the cluster,
or in a bucket under Object Lock with `--audit-bucket`).

    sovereignspec audit verify                       # the chain intact from its first record, every
                                                     # admitted workload recorded, every binding inside
                                                     # its jurisdictions; each failure named (exit 1)
    sovereignspec audit export --since 2026-12-01T00:00:00Z --format csv [--namespace team-a]
    sovereignspec audit where team-a/chat            # where a workload (or its Job) was decided and ran

The record's segments are read through the API with the caller's kubeconfig (it needs list on
auditsegments.sovereignspec.io, and on Kueue Workloads for `verify`), or from the bucket with the
AWS_* credentials in the environment (then only `verify` needs a cluster, for the Workloads).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

from sovereignspec.arguments import bounded_int
from sovereignspec.errors import ConfigError
from sovereignspec.operator.roles import record

KUEUE = ("kueue.x-k8s.io", "v1beta2", "workloads")


def add_bucket_arguments(parser: Any) -> None:
    """Where the record is kept when not in the cluster: the operator's and `audit`'s flags."""
    group = parser.add_argument_group(
        "the sovereignty record's bucket (S3-compatible, Object Lock enabled; credentials from "
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; none: AuditSegment objects in the cluster)"
    )
    group.add_argument("--audit-bucket", default="", help="the bucket's name")
    group.add_argument("--audit-endpoint", default="", help="http(s)://HOST[:PORT] of its S3 API")
    group.add_argument("--audit-prefix", default="sovereignspec/audit/", help="key prefix of the segments")
    group.add_argument(
        "--audit-retention-days",
        type=bounded_int("--audit-retention-days", 1, 36500),
        default=400,
        help="COMPLIANCE retention of each segment written (default 400)",
    )


def add_parser(sub: Any) -> None:
    audit = sub.add_parser("audit", help="verify, export or query the sovereignty record")
    audit.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config)"
    )
    add_bucket_arguments(audit)
    verbs = audit.add_subparsers(dest="audit_command", required=True)
    ve = verbs.add_parser(
        "verify", help="the chain intact, every admitted workload recorded, every binding inside"
    )
    ve.add_argument(
        "--export",
        metavar="FILE",
        help="verify a JSON-lines export of the whole record instead (no cluster, no bucket: what a "
        "regulator who was handed the file can check; admitted workloads are not checked then)",
    )
    ex = verbs.add_parser("export", help="the records as JSON lines or CSV")
    ex.add_argument("--since", help="RFC 3339 time: records at or after it (e.g. 2026-12-01T00:00:00Z)")
    ex.add_argument("--until", help="RFC 3339 time: records before it")
    ex.add_argument("--namespace", help="only this namespace's records")
    ex.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    verbs.add_parser(
        "copy",
        help="copy the cluster's record (its AuditSegments) into the bucket given, segment by segment, "
        "digests unchanged: to move an embedded record into a bucket. Run it before the operator is "
        "given the bucket; run again, it copies what the bucket lacks",
    )
    wh = verbs.add_parser("where", help="the decisions on a workload and the nodes its pods ran on")
    wh.add_argument("workload", help="NAMESPACE/NAME: the Workload's or its owner's (a Job's) name")


def _segments(api: Any) -> list[dict[str, Any]]:
    from kubernetes import client

    from sovereignspec.operator.roles.audit import read_segments

    return read_segments(client.CustomObjectsApi(api))


def _admitted(api: Any) -> dict[str, str]:
    """Admitted Workloads one of our checks decided (an entry that handed a mode): namespace/name
    by UID."""
    from kubernetes import client

    from sovereignspec.operator.decision.violations import decided_mode

    found = cast(dict[str, Any], client.CustomObjectsApi(api).list_cluster_custom_object(*KUEUE))
    out = {}
    for wl in found["items"]:
        status, meta = wl.get("status") or {}, wl["metadata"]
        ours = any(decided_mode(c) is not None for c in status.get("admissionChecks") or [])
        if ours and status.get("admission"):
            out[str(meta["uid"])] = f"{meta.get('namespace')}/{meta.get('name')}"
    return out


def verify(segments: list[dict[str, Any]], admitted: Mapping[str, str]) -> list[str]:
    """Every failure, named: the chain's breaks, admitted workloads with no decision record,
    bindings on a node outside their namespace's jurisdictions."""
    failures = [str(f) for f in record.verify(segments)]
    records = record.records_of(segments)
    failures += [
        f"admitted workload {admitted[uid]} (uid {uid}) has no decision record"
        for uid in record.unrecorded(records, admitted)
    ]
    for r in record.outside(records):
        allowed = ", ".join(r.get("jurisdictions") or [])
        if r.get("kind") == "admission":
            w, where = r.get("workload") or {}, r.get("workerJurisdiction") or "no jurisdiction"
            failures.append(
                f"record {r.get('seq')}: workload {w.get('namespace')}/{w.get('name')} admitted by worker "
                f"cluster {r.get('worker')} in {where}, outside {allowed}"
            )
            continue
        pod, where = r.get("pod") or {}, r.get("nodeJurisdiction") or "no jurisdiction"
        failures.append(
            f"record {r.get('seq')}: pod {pod.get('namespace')}/{pod.get('name')} bound to node "
            f"{r.get('node')} in {where}, outside {allowed}"
        )
    return failures


def _describe(r: dict[str, Any]) -> str:
    w = r.get("workload") or {}
    if r.get("kind") == "binding":
        pod = r.get("pod") or {}
        return (
            f"{r.get('at')}  #{r.get('seq')} pod {pod.get('name')} bound to {r.get('node')} "
            f"({r.get('nodeJurisdiction') or 'no jurisdiction label'}; allowed: "
            f"{', '.join(r.get('jurisdictions') or []) or 'anywhere'}) seen by {r.get('replica')}"
        )
    if r.get("kind") == "dispatch":
        places = ", ".join(
            f"{n} ({j or 'no jurisdiction'})" for n, j in (r.get("workerJurisdictions") or {}).items()
        )
        return (
            f"{r.get('at')}  #{r.get('seq')} {w.get('name')}: {r.get('state')} ({r.get('outcome')})"
            f"{', nominated ' + places if places else ''}, dispatched by {r.get('replica')}"
        )
    if r.get("kind") == "admission":
        return (
            f"{r.get('at')}  #{r.get('seq')} {w.get('name')}: admitted by worker cluster {r.get('worker')} "
            f"({r.get('workerJurisdiction') or 'no jurisdiction'}; allowed: "
            f"{', '.join(r.get('jurisdictions') or []) or 'anywhere'}), seen by {r.get('replica')}"
        )
    if r.get("kind") == "unwritten":
        return (
            f"{r.get('at')}  #{r.get('seq')} {w.get('name')}: the decision recorded before it was not "
            f"written ({r.get('reason')}: the workload changed meanwhile) and took no effect; "
            f"seen by {r.get('replica')}"
        )
    if r.get("kind") == "leader":
        return (
            f"{r.get('at')}  #{r.get('seq')} {r.get('replica')} leads from here on ({r.get('term')}), "
            f"having sealed {r.get('sealed')} pending workload(s)"
            + ("" if r.get("named") is None else f" of the {r.get('named')} its predecessor had on their way")
        )
    if r.get("kind") == "ignored":
        allowed = r.get("allowed")
        return (
            f"{r.get('at')}  #{r.get('seq')} {w.get('name')} on {r.get('node')}: decided {r.get('mode')}"
            + (f" (at most {allowed} draft tokens per draft)" if allowed is not None else "")
            + f", its engines proposed {r.get('draftTokens')} draft tokens in {r.get('drafts') or '?'} "
            f"drafts: the decision was not kept; seen by {r.get('replica')}"
        )
    if r.get("kind") == "ended":
        pod, finished = r.get("pod") or {}, r.get("finishedAt")
        return (
            f"{r.get('at')}  #{r.get('seq')} pod {pod.get('name')} left {r.get('node')}: {r.get('phase')}"
            + (f", its containers finished at {finished}" if finished else "")
            + f", seen by {r.get('replica')}"
        )
    return (
        f"{r.get('at')}  #{r.get('seq')} {w.get('name')}: {r.get('state')} ({r.get('outcome')}) "
        f"on {r.get('node') or 'no node'} ({r.get('nodeJurisdiction') or '-'}), {r.get('mode')} "
        f"γ={r.get('gamma')}, check {r.get('check')}, decided by {r.get('replica')}"
    )


def _verify_export(path: str) -> int:
    """`verify --export FILE`: the chain of a whole-record export, from record 0."""
    try:
        with open(path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"audit verify --export: {path}: {exc}") from None
    failures = verify([{"name": path, "index": 0, "records": records}], {})
    return _verdict(failures, f"{len(records)} records from record 0, every binding inside its "
                    "jurisdictions (admitted workloads not checked: an export names none)")  # fmt: skip


def _rewrites(segments: list[dict[str, Any]], later: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """A bucket's later versions of its segments (Object Lock keeps the first, which was verified):
    each one that is not a whole chain from where the first began (a loser's) is a failure, named;
    a loser's is a note."""
    first = {str(s.get("name")): s for s in segments}
    failures = []
    for name, version, content in later:
        found = [str(f) for f in record.verify_rewrite(first.get(name) or {}, content, version)]
        if not content.get("records"):
            found = [f"segment {name} (later version {version}): not a segment written by a replica"]
        failures += found
        if not found:  # its first version stands and is what was verified
            print(f"audit verify: note: segment {name} has a later version {version}: a replica that lost "
                  "the race for it (a whole chain from where the first began)")  # fmt: skip
    return failures


def _verdict(failures: list[str], intact: str) -> int:
    """`verify`'s answer: each failure on its line and exit 1, or what was found intact and 0."""
    for failure in failures:
        print(f"audit verify: {failure}")
    if failures:
        return 1
    print(f"audit verify: the chain is intact: {intact}")
    return 0


@contextmanager
def _reading(command: str, where: str) -> Iterator[None]:
    """What reading the record may meet, as one clear error naming `command`: no cluster (no
    kubeconfig), the API server's refusal, or the record's store refusing (`where` it is)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from sovereignspec.operator.roles.audit import StoreRefusedError

    try:
        yield
    except ConfigException as exc:
        raise ConfigError(f"{command}: no cluster to read from: {exc} (give --kubeconfig)") from None
    except ApiException as exc:
        raise ConfigError(f"{command}: reading the cluster failed: {exc.status} {exc.reason}") from None
    except StoreRefusedError as exc:
        raise ConfigError(f"{command}: reading the record in {where} failed: {exc}") from None


def _copy(args: argparse.Namespace) -> int:
    """`audit copy`: the cluster's segments into the bucket, each under the bucket's retention and
    as it was (records, digests, writer), after the segments the bucket already holds, which must
    be the same chain's first ones. The chain is verified first: a broken one is not copied."""
    from sovereignspec.operator.roles.audit import bucket_store
    from sovereignspec.operator.roles.process import api_client

    store = bucket_store(args)
    if store is None:
        raise ConfigError("audit copy: give the bucket to copy into (--audit-bucket, --audit-endpoint)")
    with _reading("audit copy", store.where()):
        segments = sorted(_segments(api_client(args.kubeconfig)), key=lambda s: int(s["index"]))
        there = store.read_segments()
    broken = record.verify(segments)
    if broken:
        raise ConfigError(f"audit copy: the cluster's record is broken, not copied: {broken[0]}")
    plain = [{k: v for k, v in s.items() if k != "name"} for s in segments]
    held = [{k: v for k, v in s.items() if k != "name"} for s in sorted(there, key=lambda s: int(s["index"]))]
    if held != plain[: len(held)]:
        raise ConfigError(
            f"audit copy: {store.where()} holds {len(held)} segments that are not the cluster's first "
            f"ones (another chain): nothing copied; give an empty prefix (--audit-prefix)"
        )
    for spec in plain[len(held) :]:
        try:
            store.create(int(spec["index"]), spec)
        except Exception as exc:  # the store's refusal, or another writer's segment
            raise ConfigError(f"audit copy: writing segment {spec['index']} failed: {exc}") from None
    count = sum(len(s.get("records") or []) for s in plain)
    print(
        f"audit copy: {len(plain) - len(held)} segments copied to {store.where()} ({len(held)} were there "
        f"already); the bucket holds the whole record: {len(plain)} segments, {count} records"
    )
    return 0


def command(args: argparse.Namespace) -> int:
    from sovereignspec.operator.roles.audit import bucket_store
    from sovereignspec.operator.roles.bucket import BucketStore
    from sovereignspec.operator.roles.process import api_client

    checking = args.audit_command == "verify"
    if args.audit_command == "copy":
        return _copy(args)
    if checking and args.export:
        return _verify_export(args.export)
    store = bucket_store(args)  # None: the cluster's AuditSegments
    with _reading("audit", store.where() if store else "the cluster"):
        segments = store.read_segments() if store is not None else None
        later = store.later_versions() if isinstance(store, BucketStore) and checking else []
        if segments is None or checking:  # verify reads the admitted Workloads from the cluster
            api = api_client(args.kubeconfig)
            segments = _segments(api) if segments is None else segments
        admitted = _admitted(api) if checking else {}
    records = record.records_of(segments)
    if checking:
        failures = verify(segments, admitted) + _rewrites(segments, later)
        intact = f"{len(records)} records in {len(segments)} segments, every admitted workload recorded"
        return _verdict(failures, intact + ", every binding inside its jurisdictions")
    if args.audit_command == "export":
        chosen = [
            r for r in records
            if (not args.since or str(r.get("at", "")) >= args.since)
            and (not args.until or str(r.get("at", "")) < args.until)
            and (not args.namespace or (r.get("workload") or {}).get("namespace") == args.namespace)
        ]  # fmt: skip
        sys.stdout.write(record.export(chosen, args.format))
        return 0
    namespace, _, name = args.workload.partition("/")
    if not name:
        raise ConfigError(f"audit where: {args.workload!r}: expected NAMESPACE/NAME")
    found = record.where(records, namespace, name)
    if not found:
        print(f"audit where: no record of {namespace}/{name}")
        return 1
    for r in found:
        print(_describe(r))
    return 0
