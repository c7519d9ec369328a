"""A LeaderWorkerSet group: one engine whose pods are its pipeline stages (tensor parallel inside a
pod), priced as the stages' sum, placed pod by pod, one mode and γ for all."""

from dataclasses import replace

import pytest

from sovereignspec.core.cluster import WorkloadRequest
from sovereignspec.core.placement import Placer
from sovereignspec.core.roofline import fits_at, pipeline_stage, roofline_for, tensor_parallel_for
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL as JUR
from sovereignspec.operator.border import annotations as ann
from tests.engine_keys import OUT_VLLM
from tests.unit.builders import cached_owners, chat, node, snapshot
from tests.unit.test_operator_decisions import _decide
from tests.unit.test_placement import cluster

SEVENTY = "llama-3.3-70b"


@pytest.mark.parametrize("stages", [2, 4, 5])
@pytest.mark.parametrize("tp", [1, 4])
def test_a_group_of_equal_stages_steps_as_the_whole_model_plus_each_stages_overhead_and_hop(
    profiles, stages, tp
):
    # 80 layers split evenly: the stages stream the weights and KV cache and compute the tokens
    # the whole model would, and each adds the GPU's fixed step cost and one hop to the next.
    gpu, model = profiles.gpus["H100-SXM"], profiles.models[SEVENTY]
    whole = roofline_for(gpu, model, tp)
    stage = roofline_for(gpu, pipeline_stage(model, stages, tp), tp)
    extra = (stages - 1) * gpu.step_overhead_s + stages * gpu.pipeline_hop_s
    for n, seqs, ctx in [(1, 1, 256), (64, 16, 1024), (512, 128, 4096), (4096, 1024, 2048)]:
        group = stages * float(stage.step_time(n, seqs, ctx))
        assert group == pytest.approx(float(whole.step_time(n, seqs, ctx)) + extra, rel=1e-12)
    # Memory per GPU: a stage holds its share of the weights and of each token's KV cache.
    assert float(stage.weight_bytes) == pytest.approx(float(whole.weight_bytes) / stages, rel=1e-12)
    assert float(stage.kv_bytes_per_token) == pytest.approx(float(whole.kv_bytes_per_token) / stages)


def test_uneven_stages_are_priced_as_the_largest_one(profiles):
    model = profiles.models[SEVENTY]
    stage = pipeline_stage(model, 3)
    assert stage.layers == 27  # vLLM gives the stages 27, 27 and 26 of 80 layers
    assert stage.params == pytest.approx(model.params * 27 / 80)
    assert stage.pipeline_stages == 3 and pipeline_stage(model, 1) == model
    # A stage runs on its pod's GPUs, whatever the model's own degree (4): the engine's per-batch
    # table and a running group's re-evaluation take the degree from the stage.
    on_eight = pipeline_stage(model, 2, 8)
    assert on_eight.tensor_parallel == 8
    assert tensor_parallel_for(profiles.gpus["H100-SXM"], on_eight) == 8


def test_a_stage_fits_where_the_whole_model_does_not(profiles):
    # 140 GB of weights: not on 4 GPUs of 24 GB (35 GB each), but half of them is (17.5 GB each).
    gpu, model = profiles.gpus["RTX-4090"], profiles.models[SEVENTY]
    assert not fits_at(gpu, model, 4)
    assert fits_at(gpu, pipeline_stage(model, 2, 4), 4)


def _four(name, jurisdiction):
    return (name, "RTX-4090", [1.0] * 4, jurisdiction)


def group(name="lws", stages=2, per_pod=4, **kw):
    return WorkloadRequest(
        name,
        "t",
        SEVENTY,
        "eagle3",
        0.8,
        gpus=stages * per_pod,
        pods=stages,
        stages=stages,
        jurisdiction="eu",
        **kw,
    )


def test_a_group_larger_than_any_node_runs_as_pipeline_stages_over_nodes_of_its_jurisdiction(profiles):
    view = cluster(*[_four(f"eu{i}", "eu") for i in range(3)], _four("kr0", "kr"))
    placer = Placer(profiles, view)
    p = placer.place(group())
    assert p.outcome == "placed", p.record.reason
    assert p.record.node_selector == {JUR: "eu"}
    assert len({n for n, _, _ in p.record.pods}) == 2 and all(n.startswith("eu") for n, _, _ in p.record.pods)
    assert "one engine in 2 pipeline stages of 4 GPUs over" in p.record.reason
    assert sorted(placer.free.tolist()) == [0, 0, 4, 4]  # two eu nodes' GPUs, once each; kr untouched
    # The same pods as independent replicas would each need the whole model: on no GPU it may use.
    replicas = Placer(profiles, view).place(replace(group(), stages=1))
    assert replicas.outcome == "rejected" and "fits no GPU" in replicas.record.reason


def test_a_groups_tpot_is_the_sum_of_its_stages_and_its_gamma_the_lowest_any_stage_got(profiles):
    # One stage on an idle node, one on a node with little headroom: the busy stage decides γ.
    view = cluster(("a", "RTX-4090", [1.0] * 4, "eu"), ("b", "RTX-4090", [0.15] * 4, "eu"))
    p = Placer(profiles, view).place(group())
    assert p.outcome == "placed", p.record.reason
    gammas = {n: g for n, _, g in p.record.pods}
    assert gammas["a"] > gammas["b"] == p.gamma
    alone = [
        Placer(profiles, cluster(spec)).place(replace(group(), gpus=4, pods=1))
        for spec in (("a", "RTX-4090", [1.0] * 4, "eu"), ("b", "RTX-4090", [0.15] * 4, "eu"))
    ]
    assert p.record.tpot_ms == pytest.approx(sum(s.record.tpot_ms for s in alone), rel=1e-9)
    # A whole group on one node: its stages there, the TPOT of a token through both.
    one = Placer(profiles, cluster(("big", "RTX-4090", [1.0] * 8, "eu"))).place(group())
    stage = Placer(profiles, cluster(("big", "RTX-4090", [1.0] * 8, "eu"))).place(
        replace(group(), gpus=4, pods=1)
    )
    assert one.record.pods == () and one.record.tpot_ms == pytest.approx(2 * stage.record.tpot_ms)


def test_each_stage_holds_its_share_of_the_groups_tpot_slo_for_later_neighbours(profiles):
    view = cluster(*[_four(f"eu{i}", "eu") for i in range(2)])
    placer = Placer(profiles, view)
    p = placer.place(group(tpot_slo_s=0.5))
    assert p.outcome == "placed"
    margin = 1.0 + placer.policy.slo_margin
    for n, g, gamma in p.record.pods:
        stage = Placer(profiles, cluster(_four(n, "eu"))).place(replace(group(), gpus=4, pods=1))
        assert stage.gamma == gamma
        i = placer._position[(n, g)]
        assert placer.slo_ratio[i] == pytest.approx(0.25 / (stage.record.tpot_ms / 1e3) / margin, rel=1e-9)


def test_a_leaderworkerset_groups_workload_is_decided_as_one_engine_of_stages() -> None:
    # Nodes of four 24 GB GPUs: the 70B model fits a group of two such pods, never one pod.
    nodes = [node(f"h{i}", "eu", gpus=4, product="NVIDIA-GeForce-RTX-4090") for i in (1, 2, 3)]
    idle = snapshot({(f"h{i}", g): 0.0 for i in (1, 2, 3) for g in range(4)})

    def seventy(kind: str):
        b = chat("lws-chat-0").annotate(model=SEVENTY, jurisdiction="eu").gpus("4").pods(2)
        return b.owned_by(kind, "chat").obj()

    group = seventy("LeaderWorkerSet")
    lws = _decide([group], nodes, idle, owners=cached_owners(group))
    assert lws.state == "Ready", lws.message
    assert "one engine in 2 pipeline stages of 4 GPUs" in lws.message, lws.message
    (update,) = lws.pod_set_updates or []
    notes = update["annotations"]
    assert len(notes[ann.OUT_NODES].split(",")) == 2
    # Speculative on idle GPUs, with the per-batch table judged on a stage (the whole model's
    # step would not fit these GPUs at all).
    assert notes[ann.OUT_MODE] == "speculative" and int(notes[ann.OUT_BUDGET]) > 0
    assert "num_speculative_tokens" in notes[OUT_VLLM], notes
    whole = seventy("Job")
    job = _decide([whole], nodes, idle, owners=cached_owners(whole))
    assert job.state == "Rejected", job.message
    assert (
        "fits no GPU of the nodes it may use on the 4 GPUs each of its pods asks for (it needs 8)"
        in job.message
    )


def test_pods_of_a_model_no_gpu_holds_at_any_degree_are_rejected_saying_so(profiles):
    tiny = replace(
        profiles,
        gpus={**profiles.gpus, "tiny": replace(profiles.gpus["H100-SXM"], name="tiny", mem_bytes=1e9)},
    )
    view = cluster(("a", "tiny", [1.0] * 4, "eu"), ("b", "tiny", [1.0] * 4, "eu"))
    for w in (group(), replace(group(), stages=1), replace(group(), gpus=None, pods=1, stages=1)):
        p = Placer(tiny, view).place(w)
        assert p.outcome == "rejected" and "fits no GPU of the nodes it may use" in p.record.reason, w
        assert "each of its pods asks for" not in p.record.reason


def test_a_pod_asking_fewer_gpus_than_its_models_weights_need_is_rejected_naming_both(profiles):
    # 70B runs at 4 H100s or more (8 RTX-4090s): one pod of 4 H100s is placed; one of 2 is told
    # the smallest degree any GPU it may use needs.
    view = cluster(("h", "H100-SXM", [1.0] * 8, "eu"), ("r", "RTX-4090", [1.0] * 8, "eu"))
    four = WorkloadRequest("four", "t", SEVENTY, "eagle3", 0.8, gpus=4, jurisdiction="eu")
    assert Placer(profiles, view).place(four).node == "h"
    p = Placer(profiles, view).place(replace(four, gpus=2))
    assert p.outcome == "rejected"
    assert p.record.reason.endswith(
        f"{SEVENTY} fits no GPU of the nodes it may use on the 2 GPUs each of its pods asks for (it needs 4)"
    ), p.record.reason


def test_a_group_of_one_gpu_pods_runs_its_stages_on_one_gpu_each_and_says_which_stage_fits_nowhere(
    profiles,
):
    assert group(per_pod=1).model_key == (SEVENTY, 2, 1)
    view = cluster(("a", "RTX-4090", [1.0] * 4, "eu"), ("b", "RTX-4090", [1.0] * 4, "eu"))
    p = Placer(profiles, view).place(group(per_pod=1))
    assert p.outcome == "rejected"
    assert p.record.reason.startswith(f"a stage of {SEVENTY} in 2 on 1 GPUs fits no GPU"), p.record.reason
