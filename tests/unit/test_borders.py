"""The borders where user, administrator and exporter input enters: annotation grammar, tenancy,
Kubernetes quantities, telemetry validation, consistent pod annotations and short messages."""

from __future__ import annotations

from fractions import Fraction

import pytest

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import UnreadableFieldError, gpu_quantity, parse_quantity
from sovereignspec.operator.border.world import tenancy_of
from sovereignspec.operator.decision.plan import shorten
from sovereignspec.telemetry.dcgm import parse_exposition
from sovereignspec.telemetry.snapshot import activity_readings, normalise_activity

MODELS, DRAFTERS = {"llama-3.1-8b"}, {"eagle3", "ngram"}


def _parse(notes: dict[str, str], tenancy: ann.Tenancy | str = "team", **kw: object) -> ann.Declared:
    return ann.parse({ann.PREFIX + k: v for k, v in notes.items()}, tenancy, MODELS, DRAFTERS, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tenant", "team\n"),
        ("tenant", "other"),
        ("jurisdiction", "kr\n"),
        ("jurisdiction", "KR"),
        ("jurisdiction", " eu"),
        ("exclusive-node", "TRUE"),
        ("exclusive-node", "True"),
        ("exclusive-node", "yes"),
        ("Jurisdiction", "kr"),
        ("jurisdicton", "kr"),
        ("tenants", "team"),
        ("data-residency", "kr"),
    ],
)
def test_a_loose_or_unknown_sovereignty_key_fails_closed(key: str, value: str) -> None:
    declared = _parse({key: value})
    assert declared.sovereignty_problems, declared
    assert declared.sovereignty_problems[0].sovereignty


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("acceptance-rate", "inf"),
        ("acceptance-rate", "nan"),
        ("acceptance-rate", "1.5"),
        ("acceptance-rate", "0,8"),
        ("tpot-slo-ms", "inf"),
        ("tpot-slo-ms", "1e309"),
        ("tpot-slo-ms", "0"),
        ("tpot-slo-ms", "-5"),
        ("tpot-slo-ms", "1e3"),
        ("max-num-seqs", "1e300"),
        ("max-num-seqs", "８"),
        ("max-num-seqs", "8.0"),
        ("max-num-seqs", "0"),
        ("context-length", "1_0"),
        ("context-length", "+10"),
        ("latency-class", "Latency"),
        ("drafter", "EAGLE3"),
    ],
)
def test_a_malformed_performance_value_turns_speculation_off_and_names_the_field(
    key: str, value: str
) -> None:
    declared = _parse({key: value})
    assert [p.field for p in declared.performance_problems] == [key]
    assert not declared.sovereignty_problems
    assert f"{ann.PREFIX}{key}" in str(declared.performance_problems[0])


def test_well_formed_annotations_are_read_exactly() -> None:
    declared = _parse(
        {"acceptance-rate": "0.75", "tpot-slo-ms": "40", "max-num-seqs": "16", "exclusive-node": "true"}
        | {"jurisdiction": "eu", "tenant": "team", "drafter": "none", "latency-class": "throughput"}
    )
    assert not declared.problems and not declared.warnings
    assert (declared.alpha, declared.tpot_slo_s, declared.seqs) == (0.75, 0.04, 16)
    assert declared.exclusive and declared.jurisdiction == "eu" and declared.drafter is None


def test_an_unknown_performance_key_is_a_warning_with_a_suggestion() -> None:
    declared = _parse({"acceptance-rat": "0.8"})
    assert not declared.problems and "did you mean sovereignspec.io/acceptance-rate" in declared.warnings[0]


def test_a_sovereignty_key_on_the_job_or_as_a_label_fails_closed_and_says_where_it_belongs() -> None:
    for kw in (
        {"owner_annotations": {"sovereignspec.io/jurisdiction": "kr"}},
        {"labels": {"sovereignspec.io/tenant": "x"}},
    ):
        declared = _parse({}, **kw)
        assert declared.sovereignty_problems
        assert "spec.template.metadata.annotations" in str(declared.sovereignty_problems[0])


def test_the_namespace_jurisdiction_is_required_and_annotations_only_narrow_it() -> None:
    both = ann.Tenancy("team", frozenset({"eu", "kr"}))
    assert _parse({}, both).jurisdiction is None and _parse({}, both).allowed_jurisdictions == {"eu", "kr"}
    assert _parse({"jurisdiction": "kr"}, both).jurisdiction == "kr"
    assert _parse({"jurisdiction": "us"}, both).sovereignty_problems
    assert _parse({}, ann.Tenancy("team", frozenset({"kr"}))).jurisdiction == "kr"


@pytest.mark.parametrize(
    ("labels", "mapping", "tenant", "allowed", "problem"),
    [
        ({}, {}, "ns", None, False),
        ({"sovereignspec.io/tenant": "bank"}, {}, "bank", None, False),
        ({}, {"ns": {"tenant": "bank", "jurisdictions": ["eu", "kr"]}}, "bank", {"eu", "kr"}, False),
        ({"sovereignspec.io/tenant": "bank"}, {"ns": {"tenant": "shop"}}, "shop", None, True),
        ({"sovereignspec.io/tenant": "Bad Name"}, {}, "Bad Name", None, True),
        (
            {"sovereignspec.io/jurisdiction": "kr"},
            {"ns": {"jurisdictions": ["kr", "eu"]}},
            "ns",
            {"kr"},
            False,
        ),
        ({"sovereignspec.io/jurisdiction": "us"}, {"ns": {"jurisdictions": ["kr"]}}, "ns", set(), True),
    ],
)
def test_tenancy_comes_from_what_administrators_control(labels, mapping, tenant, allowed, problem) -> None:
    policy = PolicySpec.model_validate({"tenancy": {"namespaces": mapping}})
    t = tenancy_of("ns", labels, policy)
    assert t.tenant == tenant and (
        t.jurisdictions == allowed if allowed is not None else t.jurisdictions is None
    )
    assert (t.problem is not None) == problem


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        ("1k", 1000),
        ("500m", Fraction(1, 2)),
        ("2000m", 2),
        ("1Ki", 1024),
        ("1e3", 1000),
        (".5", Fraction(1, 2)),
    ],
)
def test_quantities_follow_kubernetes_rules(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["abc", "1K", "1 k", "", "1..0", "0x10", "1e", "--1"])
def test_an_invalid_quantity_is_named(text: str) -> None:
    with pytest.raises(UnreadableFieldError, match="accepted"):
        parse_quantity(text)


def test_a_gpu_count_must_be_whole() -> None:
    assert gpu_quantity("2000m", "f") == 2
    with pytest.raises(UnreadableFieldError, match="whole number"):
        gpu_quantity("500m", "spec.x")


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([-0.3], "negative"),
        ([float("-inf")], "non-finite"),
        ([float("nan")], "non-finite"),
        ([1.5], "above-one"),
        ([0.2, 0.3], "duplicate"),
    ],
)
def test_impossible_gpu_activity_leaves_the_gpu_without_a_reading(values: list[float], reason: str) -> None:
    rejected: dict[str, int] = {}
    series = [("node", "0", v, 0.0) for v in values]
    readings, poisoned = activity_readings("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", series, rejected)
    assert not readings and poisoned == {("node", 0)} and rejected[reason] >= 1


def test_gpu_util_in_percent_is_read_as_a_ratio_and_a_scrape_with_a_lie_keeps_the_other_gpus() -> None:
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="n"} 0\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1",Hostname="n"} -1\n'
    )
    rejected: dict[str, int] = {}
    readings = parse_exposition(text, 0.0, rejected)
    assert readings[("n", 0)].activity == 0.5 and ("n", 1) not in readings and rejected == {"negative": 1}


@pytest.mark.parametrize(
    ("values", "read"),
    [
        ([0.0, 1.0, 0.0], [0.0, 0.01, 0.0]),  # an idle fleet in percent reads idle, not one GPU busy
        ([0.0, 0.0], [0.0, 0.0]),
        ([37.0, 100.0], [0.37, 1.0]),
        ([0.37, 1.0], [0.37, 1.0]),  # a fraction below one: the exporter gives ratios
    ],
)
def test_gpu_util_is_read_in_the_unit_its_exporter_uses(values: list[float], read: list[float]) -> None:
    assert normalise_activity("DCGM_FI_DEV_GPU_UTIL", values) == pytest.approx(read)
    assert normalise_activity("DCGM_FI_PROF_SM_ACTIVE", values) == values  # always a ratio


def test_messages_are_cut_at_a_word_boundary() -> None:
    text = "the quick brown fox jumps over the lazy dog " * 10
    short = shorten(text, 50)
    assert len(short) <= 50 and short.endswith("…") and short[:-1] in text and text[len(short) - 1] in " ;,"


@pytest.mark.parametrize("limit", [1, 2, 10, 44])
def test_a_message_that_fits_its_limit_exactly_is_not_cut(limit: int) -> None:
    text = ("the quick brown fox jumps over the lazy dog " * 2)[:limit]
    assert shorten(text, limit) == text
    assert len(shorten(text + "x", limit)) <= limit and shorten(text + "x", limit).endswith("…")


def test_a_message_with_no_word_boundary_past_half_its_limit_is_cut_mid_word_rather_than_emptied() -> None:
    """Cutting back to a space in the first half would throw away most of what fits."""
    assert shorten("a " + "x" * 100, 20) == "a " + "x" * 17 + "…"
    # A space before half the limit is not cut back to either; one past half is.
    assert shorten("x" * 8 + " " + "y" * 50, 20) == "x" * 8 + " " + "y" * 10 + "…"
    assert shorten("x" * 12 + " " + "y" * 50, 20) == "x" * 12 + "…"
    assert shorten("x" * 10 + " " + "y" * 50, 20) == "x" * 10 + " " + "y" * 8 + "…"  # at half: not past it


def test_liveness_says_only_ok_or_not_and_fails_once_ticks_keep_failing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import kopf

    from sovereignspec.operator.roles import main

    saved = dict(main._Runtime.state)
    try:
        main._Runtime.state.update(failing_ticks=main.UNHEALTHY_AFTER - 1, last_error="403 Forbidden")
        assert main.probe() == "ok"  # nothing else: the endpoint answers whoever reaches it
        main._Runtime.state["failing_ticks"] = main.UNHEALTHY_AFTER
        with pytest.raises(kopf.PermanentError) as failed:
            main.probe()
        assert str(failed.value) == "unhealthy"  # the reason is in the log, not on the endpoint
        assert (
            "403 Forbidden" in caplog.text and f"{main.UNHEALTHY_AFTER} ticks in a row failed" in caplog.text
        )
    finally:
        main._Runtime.state.clear()
        main._Runtime.state.update(saved)


def test_drift_is_reported_once_and_evicts_only_when_the_policy_says_so() -> None:
    from sovereignspec.core.cluster import ClusterView, WorkloadRequest
    from sovereignspec.operator.decision.ledger import Committed, Drift
    from sovereignspec.operator.decision.plan import drift_writes
    from sovereignspec.operator.decision.view import View

    entry = {"name": "c", "state": "Ready", "message": "plain γ=0 on n", "podSetUpdates": [{"name": "main"}]}
    c = Committed(
        "ns/w", "ns", "w", "n", 0, 0, 1, WorkloadRequest("ns/w", "ns", "m", None, 0.5), 0.0, None, "c",
        {"metadata": {"name": "w", "namespace": "ns"}}, entry,
    )  # fmt: skip
    view = View(ClusterView([], []), [c], [], None, drift=[Drift(c, "its node n no longer satisfies it")])
    warn, evict = (PolicySpec.model_validate({"sovereignty": {"evictOnDrift": e}}) for e in (False, True))
    (w,) = drift_writes(view, warn, {})
    assert (
        w.state == "Ready"
        and w.pod_set_updates == entry["podSetUpdates"]
        and "sovereignty drift" in w.message
    )
    assert w.events[0].reason == "SovereigntyDrift" and w.events[0].warning
    assert drift_writes(view, warn, {"ns/w": w.drift}) == []  # reported already
    (e,) = drift_writes(view, evict, {})
    assert e.state == "Retry" and e.pod_set_updates is None and e.requeue_after == evict.retry.base_seconds
