"""The chart's ValidatingAdmissionPolicies on the real API server (issue 46, item 2):

- queue-required: in a tenant namespace (labelled sovereignspec.io/jurisdiction), GPU work a tenant
  writes without a Kueue queue name is refused with a message that says what to do;
- plain-kept: a Pod decided plain whose command or arguments turn speculative decoding on is
  refused;

and everything else passes. The policies' objects are the chart's own, rendered by `helm template`
and applied with `kubectl apply`; each request is a server-side dry run made by kubectl as the user
it names (impersonated by the harness's admin), so RBAC and admission run as they would for that
user."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from localdev import controlplane
from tests.unit.test_chart import _helm_path, render

TENANT = "alice"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def _containers(gpu: str | None, init: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    if gpu == "limits":
        c["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    elif gpu == "requests":
        c["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    plain = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    return {"initContainers": [c], "containers": [plain]} if init else {"containers": [c]}


def _template(gpu: str | None, init: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "w"}},
        "spec": {**_containers(gpu, init), "restartPolicy": "Never"},
    }


def _obj(kind: str, gpu: str | None, queue: str | None, init: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{kind.lower()}-{secrets.token_hex(2)}"}
    if queue:
        meta["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    selector = {"matchLabels": {"app": "w"}}
    always = {**_template(gpu, init), "spec": {**_template(gpu, init)["spec"], "restartPolicy": "Always"}}
    body: dict[str, Any] = {
        "Pod": {"apiVersion": "v1", "spec": {**_containers(gpu, init), "restartPolicy": "Never"}},
        "Job": {"apiVersion": "batch/v1", "spec": {"template": _template(gpu, init)}},
        "CronJob": {
            "apiVersion": "batch/v1",
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": _template(gpu, init)}}},
        },
        "Deployment": {"apiVersion": "apps/v1", "spec": {"selector": selector, "template": always}},
        "ReplicaSet": {"apiVersion": "apps/v1", "spec": {"selector": selector, "template": always}},
        "StatefulSet": {"apiVersion": "apps/v1", "spec": {"selector": selector, "template": always}},
        "DaemonSet": {"apiVersion": "apps/v1", "spec": {"selector": selector, "template": always}},
        "LeaderWorkerSet": {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": always}},
        },
    }[kind]
    return {"kind": kind, "metadata": meta, **body}


def _dry_run(obj: dict[str, Any], namespace: str, user: str) -> tuple[bool, str]:
    """Whether `user` may create `obj` in `namespace` (a server-side dry run), and what was said."""
    done = controlplane.kubectl(
        "create", "--dry-run=server", "-n", namespace, "--as", user, "--as-group", "system:authenticated",
        "-f", "-", stdin=yaml.safe_dump(obj),
    )  # fmt: skip
    return done.returncode == 0, done.stdout + done.stderr


def _applied(suffix: str) -> Any:
    """The chart's policy and binding named `suffix`, applied under names of their own; removed
    afterwards."""
    helm = _helm_path()
    assert helm is not None, "make binaries builds helm"
    docs = [d for d in render(helm) if d["kind"].startswith("ValidatingAdmissionPolicy")]
    docs = [d for d in docs if d["metadata"]["name"].endswith(suffix)]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    name = f"{suffix.strip('-')}-{secrets.token_hex(3)}"
    for d in docs:
        d["metadata"]["name"] = name
    docs[1]["spec"]["policyName"] = name
    manifest = yaml.safe_dump_all(docs)
    done = controlplane.kubectl("apply", "-f", "-", stdin=manifest)
    assert done.returncode == 0, done.stderr
    yield name
    controlplane.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=manifest)


@pytest.fixture
def policy(api: client.ApiClient) -> Any:
    yield from _applied("-queue-required")


@pytest.fixture
def plain_kept(api: client.ApiClient) -> Any:
    yield from _applied("-plain-kept")


def _namespace(api: client.ApiClient, jurisdiction: str | None) -> str:
    """A namespace where the tenant and the job controller may create anything (RBAC passes, so
    what refuses is admission)."""
    name = f"queue-policy-{secrets.token_hex(3)}"
    labels = {"sovereignspec.io/test": "true"}
    if jurisdiction:
        labels["sovereignspec.io/jurisdiction"] = jurisdiction
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    subjects = [
        {"kind": "User", "name": TENANT, "apiGroup": "rbac.authorization.k8s.io"},
        {"kind": "ServiceAccount", "name": "job-controller", "namespace": "kube-system"},
    ]
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        name,
        {
            "metadata": {"name": "all"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": subjects,
        },
    )
    return name


def _until_enforced(namespace: str, probe: dict[str, Any] | None = None) -> None:
    """The API server compiles a new policy a moment after it is written: wait for its first refusal."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        allowed, _ = _dry_run(probe or _obj("Pod", "limits", None), namespace, TENANT)
        if not allowed:
            return
        time.sleep(0.5)
    raise AssertionError("the policy refused nothing within 60 s")


KINDS = ["Pod", "Job", "CronJob", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "LeaderWorkerSet"]


def test_gpu_work_without_a_queue_name_is_refused_in_a_tenant_namespace_and_nothing_else_is(
    api: client.ApiClient, policy: str
) -> None:
    tenant_ns = _namespace(api, "eu")
    other_ns = _namespace(api, None)
    _until_enforced(tenant_ns)
    cases: list[tuple[str, dict[str, Any], str, str, bool]] = []
    for kind in KINDS:
        cases += [
            (f"{kind} with a GPU limit, no queue", _obj(kind, "limits", None), tenant_ns, TENANT, False),
            (f"{kind} with a GPU request, no queue", _obj(kind, "requests", None), tenant_ns, TENANT, False),
            (
                f"{kind} with a GPU init container",
                _obj(kind, "limits", None, init=True),
                tenant_ns,
                TENANT,
                False,
            ),
            (f"{kind} with a GPU and a queue", _obj(kind, "limits", "serving"), tenant_ns, TENANT, True),
            (f"{kind} without a GPU", _obj(kind, None, None), tenant_ns, TENANT, True),
            (f"{kind} in a namespace of no jurisdiction", _obj(kind, "limits", None), other_ns, TENANT, True),
        ]
    # The job controller makes a Job's Pods (the Job was checked when the tenant wrote it).
    cases.append(
        ("Pod made by the job controller", _obj("Pod", "limits", None), tenant_ns, JOB_CONTROLLER, True)
    )
    wrong = []
    for what, obj, ns, user, expected in cases:
        allowed, said = _dry_run(obj, ns, user)
        if allowed != expected:
            wrong.append(f"{what}: {'allowed' if allowed else 'refused'}: {said.strip()}")
    assert not wrong, "\n".join(wrong)
    # The refusal says what is wrong and what to do, naming the object and the namespace's jurisdiction.
    job = _obj("Job", "limits", None)
    _, said = _dry_run(job, tenant_ns, TENANT)
    assert (
        "forbidden" in said and f"Job {tenant_ns}/{job['metadata']['name']} asks for nvidia.com/gpu" in said
    )
    assert "namespace of jurisdiction eu without a kueue.x-k8s.io/queue-name label" in said, said
    assert "add the label naming a LocalQueue" in said, said


def test_adding_a_gpu_to_unqueued_work_in_a_tenant_namespace_is_refused(
    api: client.ApiClient, policy: str
) -> None:
    tenant_ns = _namespace(api, "eu")
    _until_enforced(tenant_ns)
    deployment = _obj("Deployment", None, None)
    done = controlplane.kubectl(
        "create", "-n", tenant_ns, "--as", TENANT, "-f", "-", stdin=yaml.safe_dump(deployment)
    )
    assert done.returncode == 0, done.stderr
    name = deployment["metadata"]["name"]
    gpu = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    patch = json.dumps({"spec": {"template": {"spec": {"containers": [gpu]}}}})
    done = controlplane.kubectl(
        "patch", "deployment", name, "-n", tenant_ns, "--as", TENANT, "--type", "strategic", "-p", patch
    )
    assert done.returncode != 0 and "without a kueue.x-k8s.io/queue-name label" in done.stderr, done


def _engine_pod(
    mode: str | None, command: list[str] | None = None, args: list[str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "engine", "image": "registry.k8s.io/pause:3.10"}
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    meta: dict[str, Any] = {"name": f"engine-{secrets.token_hex(2)}"}
    if mode is not None:
        meta["annotations"] = {"sovereignspec.io/mode": mode}
    sidecar = {"name": "proxy", "image": "registry.k8s.io/pause:3.10", "args": ["--port", "8080"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container, sidecar]}}


def test_a_pod_decided_plain_that_turns_speculation_on_by_its_arguments_is_refused(
    api: client.ApiClient, plain_kept: str
) -> None:
    ns = _namespace(api, None)
    vllm = ["vllm", "serve", "/models/target", "--max-num-seqs", "8"]
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 4})
    _until_enforced(ns, _engine_pod("plain", args=[*vllm, "--speculative-config", spec]))
    sglang = ["python3", "-m", "sglang.launch_server", "--model-path", "m"]
    shell = ["sh", "-c", "exec vllm serve m --speculative-config '{}'"]
    plain = "plain"
    # (what, mode, command, args, allowed)
    table = [
        ("vLLM's --speculative-config", plain, None, [*vllm, "--speculative-config", spec], False),
        ("vLLM's -sc=", plain, None, [*vllm, f"-sc={spec}"], False),
        (
            "vLLM's --speculative_config.method",
            plain,
            None,
            [*vllm, "--speculative_config.method", "x"],
            False,
        ),
        ("an abbreviation", plain, None, [*vllm, "--speculative-conf", spec], False),
        ("vLLM's --num-speculative-tokens", plain, None, [*vllm, "--num-speculative-tokens=4"], False),
        (
            "SGLang's --speculative-algorithm",
            plain,
            [*sglang, "--speculative-algorithm", "EAGLE"],
            None,
            False,
        ),
        ("a shell string", plain, shell, None, False),
        ("plain and no speculation", plain, sglang, vllm, True),
        ("decided speculative", "speculative", None, [*vllm, "--speculative-config", spec], True),
        ("no decision", None, None, [*vllm, "--speculative-config", spec], True),
    ]
    cases = [(what, _engine_pod(mode, command, args), ok) for what, mode, command, args, ok in table]
    wrong = []
    for what, pod, expected in cases:
        allowed, said = _dry_run(pod, ns, TENANT)
        if allowed != expected:
            wrong.append(f"{what}: {'allowed' if allowed else 'refused'}: {said.strip()}")
    assert not wrong, "\n".join(wrong)
    pod = _engine_pod("plain", args=[*vllm, "--speculative-config", spec])
    _, said = _dry_run(pod, ns, TENANT)
    name = pod["metadata"]["name"]
    assert f"Pod {ns}/{name} was decided plain by SovereignSpec" in said, said
    assert "its container(s) engine set speculative decoding" in said, said
