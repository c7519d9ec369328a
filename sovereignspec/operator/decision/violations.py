"""What actually runs, against where it may run and how it was decided.

Where: every GPU pod bound to a node, under Kueue or not,
checked against its namespace's jurisdictions (`world.tenancy_of`: what the namespace's
administrators set, never what a workload claims) at every tick while it runs.

A decision only controls what passes through our admission check. A pod created without a queue
name (Kueue never sees it), a node relabelled under running work, a scheduler's or an operator's
own binding: each can put a tenant's work where its namespace may not run. This finds them after
the fact; it prevents nothing (the chart's admission policies and the decision do that).

How: a running workload decided plain whose engines' draft counters rise, or decided speculative
whose engines draft more tokens per draft than its decision handed them (`ignored`), does not keep
its decision: by arguments or a configuration file no admission policy reads.

No I/O: plain dicts in, plain data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sovereignspec.operator.border.annotations import OUT_MODE
from sovereignspec.operator.border.objects import PodView
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import NAMESPACE_JURISDICTION_LABEL, World, tenancy_of
from sovereignspec.operator.decision.ledger import Committed, handed


@dataclass(frozen=True)
class Violation:
    namespace: str
    pod: str
    uid: str
    node: str
    jurisdiction: str | None  # the node's label now (None: it has none)
    label: str  # the node label read (the policy's sovereignty.jurisdictionLabel)
    allowed: frozenset[str]
    source: str  # where the namespace's jurisdictions come from
    check: str  # the AdmissionCheck whose policy's tenancy found it ("" for the default)
    obj: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        """One violation per pod and node: a pod is bound once, so this is one per binding."""
        return (self.uid or f"{self.namespace}/{self.pod}", self.node)

    @property
    def message(self) -> str:
        where = f"in {self.jurisdiction}"
        if self.jurisdiction is None:
            where = f"without a {self.label} label"
        return (
            f"pod {self.namespace}/{self.pod} runs on node {self.node}, {where}; its namespace may run "
            f"only in {', '.join(sorted(self.allowed)) or 'no jurisdiction'} ({self.source}). SovereignSpec "
            "did not place it there: it came by a path the admission check does not control (no "
            "queue name, a node relabelled under it, a binding made elsewhere)."
        )


def violations(world: World, default: PolicySpec, errors: list[str] | None = None) -> list[Violation]:
    """Every bound, running GPU pod on a node outside its namespace's jurisdictions, under each
    policy a check of ours uses (the first that finds it names it); namespaces that declare no
    jurisdiction are not checked. A pod on a node no longer in the cluster is the ledger's drift,
    not this. A pod that cannot be read is named in `errors` and skipped alone."""
    labels = {n.name: n.labels for n in world.node_views}
    policies: list[tuple[str, PolicySpec]] = []
    for check, given in sorted(world.policies.items()):
        if all(given is not seen for _, seen in policies):
            policies.append((check, given))
    policies = policies or [("", default)]
    out: list[Violation] = []
    for pod in world.pod_views:
        if not pod.running or pod.node not in labels:
            continue
        if pod.gpu_error is not None:
            if errors is not None:
                errors.append(f"Pod {pod.namespace}/{pod.name}: {pod.gpu_error}")
            continue
        try:
            found = _violation(pod, world, policies, labels)
        except Exception as exc:
            if errors is not None:
                errors.append(f"Pod {pod.namespace}/{pod.name}: {type(exc).__name__}: {exc}")
            continue
        if found is not None:
            out.append(found)
    return out


def _violation(
    pod: PodView,
    world: World,
    policies: list[tuple[str, PolicySpec]],
    labels: Mapping[str, Mapping[str, str]],
) -> Violation | None:
    """`pod`'s violation, if it is a running GPU pod on a known node outside its namespace's
    jurisdictions under one of `policies`."""
    node = pod.node  # running, on a node in `labels` (the caller's filter)
    if node is None or pod.gpus <= 0:
        return None
    namespace = pod.namespace
    for check, policy in policies:
        tenancy = tenancy_of(namespace, world.namespaces.get(namespace), policy)
        if tenancy.jurisdictions is None:
            continue
        label = policy.sovereignty.jurisdiction_label
        actual = labels[node].get(label)
        if actual in tenancy.jurisdictions:
            continue
        return Violation(
            namespace, pod.name, pod.uid, node,
            None if actual is None else str(actual), label, tenancy.jurisdictions,
            _jurisdictions_from(namespace, world.namespaces.get(namespace), policy), check, pod.raw,
        )  # fmt: skip
    return None


def _jurisdictions_from(namespace: str, labels: Mapping[str, str] | None, policy: PolicySpec) -> str:
    """Where a namespace's jurisdictions were set, as `tenancy_of` reads them."""
    said = []
    if NAMESPACE_JURISDICTION_LABEL in (labels or {}):
        said.append(f"namespace label {NAMESPACE_JURISDICTION_LABEL}")
    mapped = policy.tenancy.namespaces.get(namespace)
    if mapped is not None and mapped.jurisdictions is not None:
        said.append("the SpeculationPolicy's tenancy.namespaces")
    return " and ".join(said)


@dataclass(frozen=True)
class Ignored:
    """A running workload whose engines did not keep its decision: decided plain, they drafted;
    decided speculative, they drafted longer than the decision's largest budget (`allowed`)."""

    committed: Committed
    draft_tokens: float  # proposed over the reading's window
    drafts: float = 0.0  # drafts proposed over the same window (read for speculative decisions)
    allowed: int | None = None  # the most tokens per draft the decision handed (None: it was plain)

    @property
    def message(self) -> str:
        c = self.committed
        if self.allowed is not None:
            return (
                f"decided speculative decode with at most {self.allowed} draft tokens per step on node "
                f"{c.node}, but its engine proposed {self.draft_tokens / self.drafts:.1f} per draft "
                f"({self.draft_tokens:.0f} tokens in {self.drafts:.0f} drafts over the last readings): "
                "it drafts beyond its table, whose budget keeps the GPU's other tenants within their "
                "latency bounds. Its own arguments or configuration set the draft length; remove that, "
                "or let `sovereignspec launch` start the engine."
            )
        return (
            f"decided plain decode ({OUT_MODE}: plain) on node {c.node}, but its engine proposed "
            f"{self.draft_tokens:.0f} draft tokens over the last readings: it speculates against the "
            "decision, which was plain because drafting there costs the GPU's other tenants or the "
            "workload itself more than it gives. Its own arguments or configuration turn speculation "
            "on; remove that, or let `sovereignspec launch` start the engine."
        )


def decided_mode(entry: Mapping[str, Any]) -> str | None:
    """The mode a check entry of ours handed the workload's pods (its podSetUpdates' annotation),
    for entries read raw (the ledger's `Committed` carries it already)."""
    for update in entry.get("podSetUpdates") or []:
        mode, _ = handed(update.get("annotations") or {})
        if mode is not None:
            return mode
    return None


# Draft tokens per draft beyond the decision's budget before it counts as not kept: counters read
# at scrape times a moment apart, extrapolated by increase(), are not exact.
BEYOND_TOLERANCE = 0.25


def ignored(
    committed: Iterable[Committed],
    drafting: Mapping[tuple[str, str], float],
    drafts: Mapping[tuple[str, str], float] | None = None,
) -> list[Ignored]:
    """Every running decision its engines did not keep over the telemetry's window (`drafting`:
    (namespace, owner) -> draft tokens; `drafts`: -> drafts): decided plain, they drafted; decided
    speculative (or armed at a lighter batch), they drafted more tokens per draft than its largest
    budget. One per workload, not per spread pod. Engines with no draft counters (`Metrics.drafted`
    empty) are never found here."""
    out: list[Ignored] = []
    seen: set[str] = set()
    for c in committed:
        owner = (c.namespace, c.job)
        tokens = drafting.get(owner, 0.0)
        if tokens <= 0 or c.key in seen:
            continue
        if c.mode == "plain":
            found = Ignored(c, tokens)
        elif c.mode == "speculative":
            n, allowed = (drafts or {}).get(owner, 0.0), c.largest_budget
            if n <= 0 or allowed is None or tokens / n <= allowed + BEYOND_TOLERANCE:
                continue
            found = Ignored(c, tokens, n, allowed)
        else:
            continue
        seen.add(c.key)
        out.append(found)
    return out
