"""`sovereignspec audit` as an administrator runs it against the harness's control plane, and the
part of its answer that concerns one test (every test's workloads share the cluster's one record)."""

from __future__ import annotations

import subprocess
import sys

from localdev import controlplane


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    """`sovereignspec audit` as an administrator runs it, with the harness's admin kubeconfig."""
    kubeconfig = str(controlplane.kubeconfig("admin"))
    return subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", "--kubeconfig", kubeconfig, *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def mine(out: str, namespace: str) -> list[str]:
    """`audit verify`'s failures that concern this test: its namespace's, and any break of the chain
    (other tests' workloads share the cluster's one record)."""
    breaks = ("digest", "does not follow", "is missing", "sequence number")
    return [line for line in out.splitlines() if namespace in line or any(b in line for b in breaks)]
