"""Start the operator process: logging, API client, metrics endpoint, then kopf."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import uuid
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from prometheus_client import start_http_server

from sovereignspec.operator.roles import main as handlers
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.roles.dispatcher import DISPATCHER_NAME, DispatchController
from sovereignspec.operator.roles.role import Settings
from sovereignspec.operator.runtime import secure_metrics
from sovereignspec.operator.runtime.identity import operator_identity
from sovereignspec.operator.runtime.leader import LeaderElector
from sovereignspec.profiles import load_profiles

WORKER_NAME = "sovereignspec.io/speculation"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf logs in through the same file
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def replica_identity() -> str:
    """One identity per process, as client-go's hostname_uuid: a container restarted in the same
    Pod is a new candidate, never mistaken for the holder it replaces."""
    return f"{os.environ.get('POD_NAME') or operator_identity()}_{uuid.uuid4().hex[:12]}"


def elector(
    api: client.ApiClient, args: argparse.Namespace, field_manager: str, identity: str
) -> LeaderElector | None:
    if not getattr(args, "leader_elect", False):
        return None
    namespace = args.leader_election_namespace or os.environ.get("POD_NAMESPACE")
    if not namespace and IN_CLUSTER_NAMESPACE.exists():
        namespace = IN_CLUSTER_NAMESPACE.read_text().strip()
    if not namespace:
        raise SystemExit(
            "sovereignspec operator: --leader-elect needs --leader-election-namespace (or POD_NAMESPACE, "
            "or to run in a Pod)"
        )
    try:
        return LeaderElector(
            api,
            namespace,
            args.leader_election_id or field_manager,
            identity,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    except ValueError as exc:
        raise SystemExit(f"sovereignspec operator: {exc}") from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf").setLevel(logging.WARNING)
    profiles = load_profiles(args.profiles)
    role = getattr(args, "role", "worker")
    dispatcher = role == "dispatcher"
    settings = Settings(
        controller_name=args.controller_name or (DISPATCHER_NAME if dispatcher else WORKER_NAME),
        field_manager=args.field_manager
        or ("sovereignspec-dispatcher" if dispatcher else "sovereignspec-controller"),
        write_workers=args.write_workers,
        tick_limit=getattr(args, "tick_limit", 500),
        nominate=getattr(args, "nominate", 1),
        learn_refit_seconds=getattr(args, "learn_refit_seconds", 60.0),
        learn_window_seconds=getattr(args, "learn_window_seconds", 3600.0),
        identity=replica_identity(),
        audit_required=getattr(args, "audit_required", True),
        audit_bucket=getattr(args, "audit_bucket", "") or "",
        audit_endpoint=getattr(args, "audit_endpoint", "") or "",
        audit_prefix=getattr(args, "audit_prefix", "sovereignspec/audit/"),
        audit_retention_days=getattr(args, "audit_retention_days", 400),
    )
    kind = DispatchController if dispatcher else Controller
    api = api_client(args.kubeconfig)
    handlers.configure(
        kind(api, profiles, settings), elector(api, args, settings.field_manager, settings.identity)
    )
    logging.getLogger("sovereignspec").info("role %s, controllerName %s", role, settings.controller_name)
    if args.metrics_port and getattr(args, "metrics_secure", False):
        secure_metrics.serve(api, args.metrics_port, args.bind, args.metrics_cert_dir)
    elif args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind)
    liveness = f"http://{args.bind}:{args.liveness_port}/healthz" if args.liveness_port else None
    with contextlib.suppress(asyncio.CancelledError):  # as kopf.run: a cancelled operator has stopped
        asyncio.run(
            handlers.operate(
                clusterwide=True,
                standalone=True,
                liveness_endpoint=liveness,
                identity=cast(Any, operator_identity()),  # kopf's Identity is a NewType of str
            )
        )
    if handlers.lost_leadership():
        logging.getLogger("sovereignspec").error("exiting: leadership lost (a restart rejoins as a standby)")
        return 1
    return 0
