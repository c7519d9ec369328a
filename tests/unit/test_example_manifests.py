"""deploy/examples/ and the chart fit together: the examples' queue lists the check the chart
creates, and `kubectl apply -f deploy/examples/` never overwrites what the chart owns."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
CHART_OWNS = {"SpeculationPolicy", "AdmissionCheck"}


def _docs(folder: Path) -> list[dict]:
    return [d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_applying_the_examples_after_the_chart_overwrites_none_of_the_charts_objects() -> None:
    kinds = {d["kind"] for d in _docs(EXAMPLES)}
    assert not kinds & CHART_OWNS, kinds & CHART_OWNS


def test_the_example_queue_lists_the_check_the_chart_and_the_chartless_manifests_create() -> None:
    values = yaml.safe_load((REPO / "charts/sovereignspec/values.yaml").read_text())
    queue = next(d for d in _docs(EXAMPLES) if d["kind"] == "ClusterQueue")
    listed = {c["name"] for c in queue["spec"]["admissionChecksStrategy"]["admissionChecks"]}
    chartless = {
        d["metadata"]["name"] for d in _docs(EXAMPLES / "without-chart") if d["kind"] == "AdmissionCheck"
    }
    assert listed == {values["admissionCheck"]["name"]} == chartless
    policy = next(d for d in _docs(EXAMPLES / "without-chart") if d["kind"] == "SpeculationPolicy")
    assert policy["metadata"]["name"] == values["policy"]["name"]


def test_the_serving_shapes_examples_declare_keys_that_parse_cleanly_against_the_shipped_profiles() -> None:
    from sovereignspec.operator.border import annotations as ann
    from sovereignspec.profiles import load_profiles

    profiles = load_profiles(None)
    templates = []
    for d in _docs(EXAMPLES / "serving-shapes"):
        if d["kind"] == "Deployment":
            templates.append(d["spec"]["template"])
        elif d["kind"] == "LeaderWorkerSet":
            templates.append(d["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    assert len(templates) == 2
    for tpl in templates:
        declared = ann.parse(
            tpl["metadata"]["annotations"],
            ann.Tenancy("llm-serving"),
            set(profiles.models),
            set(profiles.drafters),
            labels=tpl["metadata"]["labels"],
        )
        assert not declared.sovereignty_problems and not declared.performance_problems, declared
        assert declared.model in profiles.models and declared.jurisdiction == "eu"
