"""The shipped scrape job (deploy/prometheus/serving-engines.yaml) pointed at local targets: its
relabelling unchanged, Kubernetes service discovery replaced by static targets that carry the labels
discovery would give them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SCRAPE = REPO / "deploy" / "prometheus" / "serving-engines.yaml"


def discovered(targets: list[tuple[str, str, str, bool]]) -> dict[str, Any]:
    """The shipped scrape job with Kubernetes service discovery replaced by static targets that
    carry the labels discovery would give them: (address, namespace, job, serving-label). A job
    of "pod:NAME" is a Pod of no Job (a Deployment's replica): its name and no job labels; one of
    "group:WORKLOAD" a Pod of a group (a StatefulSet's), named by Kueue's prebuilt-workload key."""
    job = copy.deepcopy(yaml.safe_load(SCRAPE.read_text()))
    del job["kubernetes_sd_configs"]
    job["scrape_interval"] = "1s"

    def pod_labels(jobname: str) -> dict[str, str]:
        if jobname.startswith("pod:"):
            return {"__meta_kubernetes_pod_name": jobname[4:]}
        if jobname.startswith("group:"):  # a StatefulSet's pod: Kueue's prebuilt Workload, annotated
            return {
                "__meta_kubernetes_pod_name": "chat-0",
                "__meta_kubernetes_pod_annotation_kueue_x_k8s_io_prebuilt_workload_name": jobname[6:],
            }
        return {
            "__meta_kubernetes_pod_name": f"{jobname}-abcde",
            "__meta_kubernetes_pod_label_job_name": jobname,
            "__meta_kubernetes_pod_label_batch_kubernetes_io_job_name": jobname,
        }

    job["static_configs"] = [
        {
            "targets": [address],
            "labels": {
                "__meta_kubernetes_namespace": namespace,
                "__meta_kubernetes_pod_container_port_name": "http",
                **pod_labels(jobname),
                **({"__meta_kubernetes_pod_label_sovereignspec_io_serving": "true"} if serving else {}),
            },
        }
        for address, namespace, jobname, serving in targets
    ]
    return job
