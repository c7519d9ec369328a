"""The Helm chart: it lints, renders with least-privilege RBAC and a restricted security context,
and its values schema refuses what it should. Rendering uses the pinned helm binary that
`make binaries` builds (tests fail, rather than skip, without it in CI)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from localdev import controlplane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "sovereignspec"


def _helm_path() -> Path | None:
    return controlplane.pinned_binary("helm")


@pytest.fixture(scope="module")
def helm() -> Path:
    path = _helm_path()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("helm is missing: `make binaries` builds it")
        pytest.skip("helm not built yet (make binaries)")
    return path


def render(helm: Path, *sets: str) -> list[dict]:
    args = [str(helm), "template", "t", str(CHART), "-n", "sovereignspec-system", "--kube-version", "1.36.3",
            "--include-crds"]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_chart_lints(helm):
    result = subprocess.run([str(helm), "lint", str(CHART)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_render_has_crd_rbac_controller_policy_and_check(helm):
    kinds = sorted(d["kind"] for d in render(helm))
    assert kinds == sorted([
        "CustomResourceDefinition", "CustomResourceDefinition",  # SpeculationPolicy, LearnedProfile
        "CustomResourceDefinition",  # AuditSegment: the sovereignty record
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
        "Service", "SpeculationPolicy", "AdmissionCheck", "Role", "RoleBinding", "PodDisruptionBudget",
        "ClusterRole",  # RELEASE-metrics-reader, for Prometheus
        "Secret",  # RELEASE-metrics-cert: the metrics endpoint's certificate and its CA
        # RELEASE-queue-required (GPU work in tenant namespaces goes through Kueue) and
        # RELEASE-plain-kept (a pod decided plain does not turn speculation on)
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ])  # fmt: skip


def rules(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((CHART / "files" / f"clusterrole-rules{name}.yaml").read_text()))


def test_rbac_is_least_privilege_and_the_same_as_the_harness_uses(helm):
    role = next(d for d in render(helm) if d["kind"] == "ClusterRole")
    # The harness binds the first file; the secure metrics test adds the second.
    assert role["rules"] == rules("") + rules("-metrics-auth")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        # Nothing is created but Events, reviews (answers, not objects), our own LearnedProfiles
        # (a server-side apply that creates one needs create) and the sovereignty record's segments
        # (created once, never patched); nothing is updated or deleted.
        assert not {"delete", "deletecollection", "update"} & set(rule["verbs"])
        assert "create" not in rule["verbs"] or rule["resources"] in (
            ["events"], ["tokenreviews"], ["subjectaccessreviews"], ["learnedprofiles"], ["auditsegments"]
        )  # fmt: skip
        if rule["resources"] == ["auditsegments"]:
            assert sorted(rule["verbs"]) == ["create", "list"]
        if any(r.endswith("/status") for r in rule["resources"]):
            assert set(rule["verbs"]) <= {"get", "patch"}
    assert not any("secrets" in r["resources"] for r in role["rules"])


def lease_rules(lease: str) -> list[dict[str, Any]]:
    """The chart's leader-election rules, its Lease's name put where the template puts it."""
    text = (CHART / "files/role-rules-leader-election.yaml").read_text()
    return list(yaml.safe_load(re.sub(r"\{\{[^}]*\}\}", lease, text)))


def test_two_replicas_elect_a_leader_on_a_lease_only_they_may_touch(helm):
    docs = render(helm)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--leader-election-id=t-sovereignspec" in args
    assert {"--lease-duration=15", "--renew-deadline=10", "--retry-period=2"} <= set(args)
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == "sovereignspec-system"
    # create cannot name its object; get, update and a standby's list and watch (by field selector)
    # touch only this release's Lease.
    assert role["rules"] == lease_rules("t-sovereignspec") == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["t-sovereignspec"],
         "verbs": ["get", "list", "watch", "update"]},
    ]  # fmt: skip
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "t-sovereignspec",
                                    "namespace": "sovereignspec-system"}]  # fmt: skip
    assert next(d for d in docs if d["kind"] == "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_one_replica_without_election_is_recreated_never_two_at_once(helm):
    docs = render(helm, "replicaCount=1", "leaderElection.enabled=false")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--leader", "--lease", "--renew", "--retry"))]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]


@pytest.mark.parametrize(
    "timing",
    [
        "leaderElection.renewDeadlineSeconds=15",  # the leader would still write when a standby takes over
        "leaderElection.retryPeriodSeconds=9",  # no second try to renew before the deadline
    ],
)
def test_lease_timings_a_standby_could_take_over_under_a_writing_leader_are_refused(helm, timing):
    args = [str(helm), "template", "t", str(CHART), "--kube-version", "1.36.3", "--set", timing]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "need leaseDurationSeconds > renewDeadlineSeconds > 1.2 x retryPeriodSeconds" in result.stderr


def test_the_controller_runs_restricted(helm):
    deploy = next(d for d in render(helm) if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--controller-name=sovereignspec.io/speculation" in container["args"]


def test_optional_parts_render_when_enabled(helm):
    docs = render(helm, "metrics.serviceMonitor.enabled=true", "podDisruptionBudget.enabled=true",
                  "profilesConfigMap=my-profiles")  # fmt: skip
    kinds = {d["kind"] for d in docs}
    assert {"ServiceMonitor", "PodDisruptionBudget"} <= kinds
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    assert any(
        v.get("configMap", {}).get("name") == "my-profiles"
        for v in deploy["spec"]["template"]["spec"]["volumes"]
    )


def test_the_node_agent_and_the_engine_podmonitor_render_when_enabled_and_stay_apart(helm):
    docs = render(helm, "agent.enabled=true", "engineMetrics.podMonitor.enabled=true")
    agent = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = agent["spec"]["template"]
    labels = pod["metadata"]["labels"]
    # No selector of the controller's picks an agent pod (its Service would send traffic there).
    for d in docs:
        if d["kind"] in ("Deployment", "Service"):
            selector = d["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert not all(labels.get(k) == v for k, v in selector.items()), d["kind"]
    container = pod["spec"]["containers"][0]
    assert container["args"][0] == "agent"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"sovereignspec.io/serving": "true"}
    assert not {"DaemonSet", "PodMonitor"} & {d["kind"] for d in render(helm)}  # off by default


@pytest.mark.parametrize(
    "bad",
    [
        "replicaCount=11",
        "leaderElection.enabled=false",  # two replicas (the default) without an election
        "leaderElection.retryPeriodSeconds=0",
        "logLevel=verbose",
        "controllerName=no-slash",
        "unknownKey=1",
    ],
)
def test_the_values_schema_refuses_bad_values(helm, bad):
    args = [str(helm), "template", "t", str(CHART), "--kube-version", "1.36.3", "--set", bad]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "schema" in (result.stderr + result.stdout).lower()


def parent_chart(
    helm: Path, tmp_path: Path, values: dict[str, Any] | None = None, **dependency: str
) -> Callable[..., set[str]]:
    """A platform chart that depends on this one (with `dependency`'s extra fields, a condition
    say) and `values`; returns what renders it with `--set` arguments, as the kinds it makes."""
    parent = tmp_path / "platform"
    parent.mkdir()
    dep = {"name": "sovereignspec", "version": "*", "repository": f"file://{CHART}", **dependency}
    (parent / "Chart.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v2", "name": "platform", "version": "0.1.0", "dependencies": [dep]})
    )
    (parent / "values.yaml").write_text(yaml.safe_dump(values or {}))
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "cfg"),
    }
    update = subprocess.run(
        [str(helm), "dependency", "update", str(parent)], capture_output=True, text=True, check=False, env=env
    )
    assert update.returncode == 0, update.stderr

    def kinds(*sets: str) -> set[str]:
        args = [str(helm), "template", "p", str(parent)] + [a for s in sets for a in ("--set", s)]
        out = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
        assert out.returncode == 0, out.stderr
        return {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}

    return kinds


def test_the_chart_renders_as_a_dependency_of_a_parent_chart_with_global_values(helm, tmp_path):
    render_parent = parent_chart(helm, tmp_path, {"global": {"imageRegistry": "registry.example"}})
    assert {"Deployment", "ClusterRole", "AdmissionCheck"} <= render_parent("global.team=serving")


def test_the_dispatcher_role_renders_its_flag_controller_name_and_read_rights(helm):
    docs = render(helm, "role=dispatcher", "dispatcher.nominate=2")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--role=dispatcher" in args and "--nominate=2" in args
    assert "--controller-name=sovereignspec.io/dispatcher" in args
    assert "--field-manager=sovereignspec-dispatcher" in args
    check = next(d for d in docs if d["kind"] == "AdmissionCheck")
    assert check["spec"]["controllerName"] == "sovereignspec.io/dispatcher"
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == rules("") + rules("-dispatcher") + rules("-metrics-auth")
    # The worker role (the default) keeps its name and reads no MultiKueue objects.
    worker = render(helm)
    args = next(d for d in worker if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--role=worker" in args and "--controller-name=sovereignspec.io/speculation" in args
    granted = next(d for d in worker if d["kind"] == "ClusterRole")["rules"]
    assert not any("multikueueclusters" in r["resources"] for r in granted)


def test_the_values_schema_refuses_an_unknown_role(helm):
    args = [str(helm), "template", "t", str(CHART), "--set", "role=manager"]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "role" in result.stderr


def test_the_dispatcher_role_ships_a_policy_that_lets_only_it_and_kueue_nominate_workers(helm):
    docs = [d for d in render(helm, "role=dispatcher") if d["metadata"]["name"].endswith("-nomination")]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["workloads/status"] and rule["apiGroups"] == ["kueue.x-k8s.io"]
    allowed = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "allowed")
    assert json.loads(allowed) == [
        "system:serviceaccount:sovereignspec-system:t-sovereignspec",  # the chart's own account
        "system:serviceaccount:kueue-system:kueue-controller-manager",
    ]
    # The workers' role has nothing to guard; the policy can be left out; before 1.30 there is no v1.
    assert not any(d["metadata"]["name"].endswith("-nomination") for d in render(helm))
    off = render(helm, "role=dispatcher", "dispatcher.guardNomination=false")
    assert not any(d["metadata"]["name"].endswith("-nomination") for d in off)
    old = subprocess.run(
        [str(helm), "template", "t", str(CHART), "--kube-version", "1.29.4", "--set", "role=dispatcher"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "ValidatingAdmissionPolicy" not in old


def test_the_queue_required_policy_is_on_by_default_and_its_values_reach_it(helm):
    def queue_policy(*sets: str) -> list[dict]:
        return [d for d in render(helm, *sets) if d["metadata"]["name"] == "t-sovereignspec-queue-required"]

    policy, binding = queue_policy()
    assert binding["spec"] == {"policyName": "t-sovereignspec-queue-required", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
    assert selector == {"matchExpressions": [{"key": "sovereignspec.io/jurisdiction", "operator": "Exists"}]}
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["resources"]) == ["nvidia.com/gpu"]
    assert "system:serviceaccount:kube-system:job-controller" in json.loads(variables["controllers"])
    # Both roles: a MultiKueue manager's tenant namespaces are tenant namespaces too.
    assert len(queue_policy("role=dispatcher")) == 2
    _, warn = queue_policy("admissionPolicies.queueRequired.validationActions={Warn,Audit}")
    assert warn["spec"]["validationActions"] == ["Warn", "Audit"]
    policy, _ = queue_policy("admissionPolicies.queueRequired.gpuResources={nvidia.com/gpu,amd.com/gpu}")
    resources = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "resources")
    assert json.loads(resources) == ["nvidia.com/gpu", "amd.com/gpu"]
    assert queue_policy("admissionPolicies.queueRequired.enabled=false") == []
    refused = subprocess.run(
        [str(helm), "template", "t", str(CHART), "--kube-version", "1.36.3",
         "--set", "admissionPolicies.queueRequired.validationActions={Allow}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "validationActions" in refused.stderr


def notes(helm: Path, tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (`helm template` leaves it out, and a dry-run install
    needs a cluster): rendered from a copy of the chart where it is a named template."""
    import shutil

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "test.notes" -}}\n' + text + "\n{{- end -}}\n"
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: |\n{{ include "test.notes" . | indent 4 }}\n'
    )
    args = [str(helm), "template", "t", str(chart), "-n", "ns", "--kube-version", "1.36.3"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    (doc,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "notes"
    ]
    return str(doc["data"]["notes"])


def test_the_notes_tell_each_role_what_it_serves_and_how_to_wire_it(helm, tmp_path):
    worker = notes(helm, tmp_path / "w")
    assert "places serving workloads on this cluster's nodes" in worker
    assert "controllerName sovereignspec.io/speculation" in worker and "dispatcherName" not in worker
    dispatcher = notes(helm, tmp_path / "d", "role=dispatcher")
    assert "controllerName sovereignspec.io/dispatcher" in dispatcher
    assert "dispatcherName: sovereignspec.io/dispatcher" in dispatcher
    assert "sovereignspec.io/speculation" not in dispatcher and "nominatedClusterNames" in dispatcher


def test_name_and_fullname_overrides_name_everything_it_makes(helm):
    default = {
        (d["kind"], d["metadata"]["name"]) for d in render(helm) if d["kind"] != "CustomResourceDefinition"
    }
    assert ("Deployment", "t-sovereignspec") in default
    full = render(helm, "fullnameOverride=spec-ctl")
    named = {
        (d["kind"], d["metadata"]["name"]) for d in full if d["kind"] in ("Deployment", "ServiceAccount")
    }
    assert named == {("Deployment", "spec-ctl"), ("ServiceAccount", "spec-ctl")}
    short = render(helm, "nameOverride=ss")
    (deployment,) = [d for d in short if d["kind"] == "Deployment"]
    assert deployment["metadata"]["name"] == "t-ss"
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "ss"


def test_a_parent_chart_turns_it_on_and_off_with_its_enabled_condition(helm, tmp_path):
    render_parent = parent_chart(helm, tmp_path, condition="sovereignspec.enabled")
    assert {"Deployment", "ClusterRole", "AdmissionCheck"} <= render_parent("sovereignspec.enabled=true")
    assert render_parent("sovereignspec.enabled=false") == set()


def test_prometheus_credentials_are_mounted_from_secrets_and_named_by_path_in_the_policy(helm):
    docs = render(helm, "extraVolumes[0].name=prometheus-client",
                  "extraVolumes[0].secret.secretName=prometheus-client",
                  "extraVolumeMounts[0].name=prometheus-client",
                  "extraVolumeMounts[0].mountPath=/etc/sovereignspec/prometheus",
                  "extraVolumeMounts[0].readOnly=true",
                  "policy.spec.telemetry.prometheusClient.authorization.credentialsFile="
                  "/etc/sovereignspec/prometheus/token")  # fmt: skip
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {"name": "prometheus-client", "secret": {"secretName": "prometheus-client"}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {
        "name": "prometheus-client",
        "mountPath": "/etc/sovereignspec/prometheus",
        "readOnly": True,
    } in mounts
    policy = next(d for d in docs if d["kind"] == "SpeculationPolicy")
    client = policy["spec"]["telemetry"]["prometheusClient"]
    assert client == {"authorization": {"credentialsFile": "/etc/sovereignspec/prometheus/token"}}
    from sovereignspec.operator.border.policy import parse_policy

    assert parse_policy("default", policy["spec"]).telemetry.prometheus_client.authorization is not None


@pytest.mark.parametrize("source_file", sorted(p.name for p in (REPO / "crds").glob("*.yaml")))
def test_each_crd_is_a_template_that_upgrades_and_is_kept_on_uninstall_unless_told(helm, source_file):
    source = yaml.safe_load((REPO / "crds" / source_file).read_text())
    name = source["metadata"]["name"]
    crd = next(
        d for d in render(helm) if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] == name
    )
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    unkept = next(
        d for d in render(helm, "crds.keep=false")
        if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] == name
    )  # fmt: skip
    assert "annotations" not in unkept["metadata"]
    assert not [d for d in render(helm, "crds.enabled=false") if d["kind"] == "CustomResourceDefinition"]
    assert not (CHART / "crds").exists()  # Helm would install it once from there and never upgrade it
    # Its own policy cannot be mapped before the CRD exists: a hook applies it after the rest.
    policy = next(d for d in render(helm) if d["kind"] == "SpeculationPolicy")
    assert policy["metadata"]["annotations"] == {
        "helm.sh/hook": "post-install,post-upgrade,post-rollback",
        "meta.helm.sh/release-name": "t", "meta.helm.sh/release-namespace": "sovereignspec-system",
    }  # fmt: skip


def assert_signed_for(data: dict[str, str], name: str) -> None:
    """The Secret's certificate is signed by its ca.crt, names `name`, and matches its key."""
    import base64
    import ssl
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        files = {k: Path(folder) / k for k in data}
        for k, path in files.items():
            path.write_bytes(base64.b64decode(data[k]))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(files["tls.crt"]), str(files["tls.key"]))  # the key matches
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(files["tls.crt"].read_bytes())
        ca = x509.load_pem_x509_certificate(files["ca.crt"].read_bytes())
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert name in names.get_values_for_type(x509.DNSName), names


def test_metrics_are_served_over_https_to_whom_rbac_allows_and_the_servicemonitor_comes_with_a_token(helm):
    docs = render(helm, "metrics.serviceMonitor.enabled=true")
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--metrics-secure" in args and "--metrics-port=8443" in args
    reader = next(d for d in docs if d["metadata"]["name"] == "t-sovereignspec-metrics-reader")
    assert reader["kind"] == "ClusterRole" and reader["rules"] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
    ]
    endpoint = next(d for d in docs if d["kind"] == "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    # The chart's own CA and certificate by default: verified, under the Service's name.
    own = {"name": "t-sovereignspec-metrics-cert", "key": "ca.crt"}
    assert endpoint["tlsConfig"] == {
        "serverName": "t-sovereignspec-metrics.sovereignspec-system.svc",
        "ca": {"secret": own},
    }
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "--metrics-cert-dir=/etc/sovereignspec/metrics-certs" in pod["containers"][0]["args"]
    assert {"name": "metrics-certs", "secret": {"secretName": "t-sovereignspec-metrics-cert"}} in pod[
        "volumes"
    ]
    secret = next(
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "t-sovereignspec-metrics-cert"
    )
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert_signed_for(secret["data"], "t-sovereignspec-metrics.sovereignspec-system.svc")
    # With a certificate of cert-manager's: verified against its CA, under the Service's name.
    docs = render(helm, "metrics.serviceMonitor.enabled=true", "metrics.certSecret=metrics-tls")
    endpoint = next(d for d in docs if d["kind"] == "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["tlsConfig"] == {"serverName": "t-sovereignspec-metrics.sovereignspec-system.svc",
                                     "ca": {"secret": {"name": "metrics-tls", "key": "ca.crt"}}}  # fmt: skip
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "--metrics-cert-dir=/etc/sovereignspec/metrics-certs" in pod["containers"][0]["args"]
    assert {"name": "metrics-certs", "secret": {"secretName": "metrics-tls"}} in pod["volumes"]
    assert not [d for d in docs if d["kind"] == "Secret"]  # none of the chart's own then
    # Plain: no reviews, no reader role, a plain ServiceMonitor.
    docs = render(helm, "metrics.secure=false", "metrics.serviceMonitor.enabled=true")
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == rules("") and not [d for d in docs if d["metadata"]["name"].endswith("-reader")]
    assert "scheme" not in next(d for d in docs if d["kind"] == "ServiceMonitor")["spec"]["endpoints"][0]


def test_the_plain_kept_pattern_matches_every_spelling_a_launcher_refuses_and_no_other_engine_flag(helm):
    import re

    from sovereignspec.engines.launchers import LAUNCHERS
    from sovereignspec.launchkit import option_name

    policy = next(d for d in render(helm) if d["metadata"]["name"] == "t-sovereignspec-plain-kept")
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    expression = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "pattern")
    pattern = re.compile(json.loads(expression))  # a CEL string literal is a JSON one here; RE2 = re
    spellings = set()
    for launcher in LAUNCHERS:
        spellings |= set(getattr(launcher, "speculative", ())) | set(getattr(launcher, "flags", ()))
    words = set()
    for s in spellings:
        if not s.startswith("--"):
            words |= {s, f"{s}=1", f"{s}.method"}
            continue
        stem = s.rstrip("-")
        forms = {stem, stem.replace("-", "_").replace("__", "--", 1)}
        forms |= {stem[:n] for n in range(len("--spec"), len(stem))}  # argparse's abbreviations
        for f in forms:
            words |= {f, f"{f}=1", f"{f}.method", f"vllm serve m {f} 4"}
    refused = {
        w
        for w in words
        if any(
            launcher.sets_speculation(option_name(w.split()[-2] if " " in w else w) or "")
            for launcher in LAUNCHERS
        )
    }
    assert refused and not [w for w in refused if not pattern.search(w)]
    # Flags of both engines that do not draft are never matched: a plain pod keeps its own settings.
    others = [
        "--max-num-seqs", "--served-model-name", "--tensor-parallel-size", "-tp", "--num-scheduler-steps",
        "--seed", "--port", "--model-path", "--tp-size", "--mem-fraction-static", "--max-model-len",
        "--enable-prefix-caching", "--kv-cache-dtype", "--num-gpu-blocks-override", "-s", "serve",
    ]  # fmt: skip
    assert not [w for w in others if pattern.search(w) or pattern.search(f"vllm serve m {w} 1")]


@pytest.mark.parametrize(("value", "required"), [("true", True), ("false", False)])
def test_audit_required_reaches_the_operator_as_the_cli_reads_it(helm, value, required):
    """audit.required: the container's arguments, parsed by the operator's own parser."""
    from sovereignspec.cli import build_parser

    deployment = next(d for d in render(helm, f"audit.required={value}") if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_parser().parse_args(args).audit_required is required


def test_an_audit_bucket_reaches_the_operator_with_its_credentials_from_a_secret(helm):
    """audit.bucket: the flags the operator's own parser reads, the credentials from the named
    Secret (never in values); a bucket with no endpoint, or no credentials Secret, is refused at
    install."""
    from sovereignspec.cli import build_parser

    sets = ("audit.bucket.name=record", "audit.bucket.endpoint=https://s3.example.internal:9000",
            "audit.bucket.retentionDays=2555", "audit.bucket.credentialsSecret=record-writer")  # fmt: skip
    deployment = next(d for d in render(helm, *sets) if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.audit_bucket, args.audit_endpoint, args.audit_prefix, args.audit_retention_days) == (
        "record", "https://s3.example.internal:9000", "sovereignspec/audit/", 2555,
    )  # fmt: skip
    assert container["envFrom"] == [{"secretRef": {"name": "record-writer"}}]
    default = next(d for d in render(helm) if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert not [a for a in default["containers"][0]["args"] if a.startswith("--audit-bucket")]
    assert "envFrom" not in default["containers"][0]
    args = [str(helm), "template", "t", str(CHART), "--kube-version", "1.36.3", "--set", sets[0]]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert (
        result.returncode != 0 and "audit.bucket.endpoint: required with audit.bucket.name" in result.stderr
    )
    result = subprocess.run([*args, "--set", sets[1]], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "audit.bucket.credentialsSecret: required" in result.stderr, (
        result.stderr
    )
