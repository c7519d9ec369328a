"""SpeculationPolicy: the parameters object an AdmissionCheck points at (group sovereignspec.io).

The CRD's OpenAPI schema (crds/) rejects most bad input at the API server; this pydantic model is
the second line (and the only one for fields whose rules a schema cannot say), so that a bad
policy makes the AdmissionCheck inactive with a message naming the field, instead of a crash.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
)

from sovereignspec.core.cluster import PlacerSettings
from sovereignspec.core.defaults import (
    GAMMA_LIMIT,
    GAMMA_MAX,
    HEADROOM_UNCERTAINTY,
    NEIGHBOUR_SLO_MARGIN,
    PREDICTION_ERROR_BOUND,
    SELF_BENEFIT_MARGIN,
)
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL
from sovereignspec.engines import Option, policy_options
from sovereignspec.errors import describe

GROUP = "sovereignspec.io"
VERSION = "v1alpha1"
KIND = "SpeculationPolicy"
PLURAL = "speculationpolicies"

# GPU Feature Discovery's nvidia.com/gpu.product values for the shipped GPU profiles.
DEFAULT_GPU_PRODUCTS = {
    "NVIDIA-A100-SXM4-80GB": "A100-80G-SXM",
    "NVIDIA-H100-80GB-HBM3": "H100-SXM",
    "NVIDIA-H200": "H200",
    "NVIDIA-L40S": "L40S",
    "NVIDIA-GeForce-RTX-4090": "RTX-4090",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class _AcceptanceFields(_Model):
    learn: bool = Field(True, description="true or false")
    window: str = Field("5m", pattern=r"^[0-9]+[smh]$", description="a Prometheus range such as 5m")
    prior_weight_tokens: float = Field(2000.0, alias="priorWeightTokens", ge=0, description="a number >= 0")


def _option_name(option: Option) -> str:
    """The model's attribute for an engine's policy setting: its field name in snake case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", option.field).lower()


# Each engine's settings (`Engine.options`: what its metrics mean in a cluster's version of it) are
# fields here, declared by the engine's own module: a new engine's setting needs no line here.
_ENGINE_FIELDS: dict[str, Any] = {
    _option_name(option): (
        Literal[option.accepted],
        Field(option.default, alias=option.field, description=option.meaning),
    )
    for _, option in policy_options()
}
_Acceptance: type[_AcceptanceFields] = create_model(
    "_Acceptance", __base__=_AcceptanceFields, **_ENGINE_FIELDS
)


class Acceptance(_Acceptance):
    """How α is read: learned from the engines' counters over `window`, weighed against the declared
    prior, with each engine's own settings beside them (`engine_options`)."""

    def engine_options(self) -> dict[str, dict[str, str]]:
        """Per engine (`sovereignspec.engines`), what the policy says its metrics mean."""
        out: dict[str, dict[str, str]] = {}
        for engine, option in policy_options():
            out.setdefault(engine, {})[option.key] = getattr(self, _option_name(option))
        return out


_PATH = r"^/"
_PATH_TEXT = "an absolute path in the operator's Pod (a mounted Secret)"


class Authorization(_Model):
    type: Literal["Bearer"] = Field("Bearer", description="Bearer")
    credentials_file: str = Field(alias="credentialsFile", pattern=_PATH, description=_PATH_TEXT)


class BasicAuth(_Model):
    username: str = Field(min_length=1, description="a user name")
    password_file: str = Field(alias="passwordFile", pattern=_PATH, description=_PATH_TEXT)


class Tls(_Model):
    ca_file: str | None = Field(None, alias="caFile", pattern=_PATH, description=_PATH_TEXT)
    cert_file: str | None = Field(None, alias="certFile", pattern=_PATH, description=_PATH_TEXT)
    key_file: str | None = Field(None, alias="keyFile", pattern=_PATH, description=_PATH_TEXT)

    @model_validator(mode="after")
    def _pair(self) -> Tls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile: give both (a client certificate and its key) or neither")
        return self


class PrometheusClient(_Model):
    timeout_seconds: float = Field(3.0, alias="timeoutSeconds", gt=0, le=60, description="in (0, 60]")
    retries: int = Field(2, ge=0, le=5, description="an integer in 0..5")
    authorization: Authorization | None = None
    basic_auth: BasicAuth | None = Field(None, alias="basicAuth")
    tls: Tls = Field(default_factory=Tls)

    @model_validator(mode="after")
    def _one_credential(self) -> PrometheusClient:
        if self.authorization is not None and self.basic_auth is not None:
            raise ValueError("authorization and basicAuth: give one of them, not both")
        return self


class Telemetry(_Model):
    source: Literal["prometheus", "dcgm-exporter", "none"] = Field(
        "prometheus", description="prometheus, dcgm-exporter or none"
    )
    prometheus_url: str | None = Field(None, alias="prometheusURL", description="an http(s) URL")
    prometheus_client: PrometheusClient = Field(default_factory=PrometheusClient, alias="prometheusClient")
    dcgm_endpoints: list[str] = Field(default_factory=list, alias="dcgmEndpoints", description="http(s) URLs")
    staleness_seconds: float = Field(
        60.0, alias="stalenessSeconds", gt=0, le=3600, description="in (0, 3600]"
    )
    # What one reading of the engines' step times and draft counters spans: at least two scrapes.
    step_window_seconds: int = Field(
        120, alias="stepWindowSeconds", ge=10, le=3600, description="an integer in 10..3600"
    )
    headroom_uncertainty: float = Field(
        HEADROOM_UNCERTAINTY, alias="headroomUncertainty", ge=0, le=1, description="in [0, 1]"
    )
    prediction_error_bound: float = Field(
        PREDICTION_ERROR_BOUND, alias="predictionErrorBound", gt=0, le=10, description="in (0, 10]"
    )
    acceptance: Acceptance = Field(default_factory=Acceptance)


class Profiles(_Model):
    gpu_products: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_PRODUCTS),
        alias="gpuProducts",
        description="nvidia.com/gpu.product value -> GPU profile name",
    )


class Defaults(_Model):
    model: str = Field("llama-3.1-8b", description="a target model profile name")
    acceptance_rate: float = Field(0.6, alias="acceptanceRate", ge=0, le=1, description="a number in [0, 1]")
    tpot_slo_ms: float | None = Field(
        None, alias="tpotSLOMilliseconds", gt=0, description="a positive number"
    )
    latency_class: Literal["latency", "throughput"] = Field("latency", alias="latencyClass")
    max_num_seqs: int = Field(8, alias="maxNumSeqs", ge=1, description="a positive integer")
    context_length: int = Field(1024, alias="contextLength", ge=1, description="a positive integer")


class Sovereignty(_Model):
    jurisdiction_label: str = Field(
        DEFAULT_JURISDICTION_LABEL, alias="jurisdictionLabel", min_length=1, description="a node label key"
    )
    evict_on_drift: bool = Field(
        False,
        alias="evictOnDrift",
        description="true or false: set Retry on a running workload whose node no longer satisfies it",
    )


class Watch(_Model):
    """What the operator does when what runs is not what it decided."""

    evict_ignored: bool = Field(
        False,
        alias="evictIgnored",
        description="true or false: set Retry on a running workload whose engines do not keep its decision "
        "(drafting under a plain one, or beyond its table), so that Kueue evicts it to be decided again",
    )


TENANT_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"
JURISDICTION_PATTERN = r"^[a-z]{2}(-[a-z0-9]{1,16})?$"


class NamespaceTenancy(_Model):
    tenant: str | None = Field(None, pattern=TENANT_PATTERN, description="a DNS-1123 name")
    jurisdictions: list[Annotated[str, StringConstraints(pattern=JURISDICTION_PATTERN)]] | None = Field(
        None, min_length=1, description="jurisdiction codes such as eu, kr, us-east"
    )


class TenancyConfig(_Model):
    """Who a namespace belongs to, as administrators say it (workload annotations cannot)."""

    namespaces: dict[str, NamespaceTenancy] = Field(
        default_factory=dict, description="namespace -> {tenant, jurisdictions}"
    )


class PlacementConfig(_Model):
    keep_whole_nodes_free: int = Field(
        0, alias="keepWholeNodesFree", ge=0, le=10000, description="an integer >= 0 (nodes per flavor)"
    )
    pack_shared_work: bool = Field(True, alias="packSharedWork", description="true or false")
    pack_tolerance: float = Field(
        0.1, alias="packTolerance", ge=0, le=1, description="in [0, 1] (a fraction of the best TPOT)"
    )


CHECKPOINT_PATTERN = r"^[A-Za-z0-9._/:@+=-]{1,512}$"


class Drafts(_Model):
    """Where drafters' checkpoints come from for this policy's workloads: a cluster without the model
    hub serves them from local paths or volumes (a PVC mounted in the engine's pod)."""

    checkpoints: dict[str, dict[str, Annotated[str, StringConstraints(pattern=CHECKPOINT_PATTERN)]]] = Field(
        default_factory=dict,
        description="drafter profile name -> target model -> checkpoint (a path or model id)",
    )
    allowed: list[Annotated[str, StringConstraints(pattern=CHECKPOINT_PATTERN)]] = Field(
        default_factory=list,
        description="checkpoints a workload may name itself (sovereignspec.io/draft-checkpoint): an "
        "entry ending in / allows everything under it",
    )

    def allows(self, checkpoint: str) -> bool:
        if ".." in checkpoint.split("/"):
            return False  # "/models/../etc" starts with "/models/" and leaves it
        return any(checkpoint == a or (a.endswith("/") and checkpoint.startswith(a)) for a in self.allowed)


class Retry(_Model):
    base_seconds: int = Field(15, alias="baseSeconds", ge=1, le=3600, description="an integer in 1..3600")
    max_seconds: int = Field(600, alias="maxSeconds", ge=1, le=86400, description="an integer in 1..86400")


class PolicySpec(_Model):
    telemetry: Telemetry = Field(default_factory=Telemetry)
    profiles: Profiles = Field(default_factory=Profiles)
    gamma_max: int = Field(
        GAMMA_MAX, alias="gammaMax", ge=0, le=GAMMA_LIMIT, description=f"an integer in 0..{GAMMA_LIMIT}"
    )
    self_benefit_margin: float = Field(
        SELF_BENEFIT_MARGIN, alias="selfBenefitMargin", ge=0, le=1, description="in [0, 1]"
    )
    externality: bool = Field(True, description="true or false")
    neighbour_slo_margin: float = Field(
        NEIGHBOUR_SLO_MARGIN, alias="neighbourSloMargin", ge=0, le=1, description="in [0, 1]"
    )
    defaults: Defaults = Field(default_factory=Defaults)
    sovereignty: Sovereignty = Field(default_factory=Sovereignty)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    retry: Retry = Field(default_factory=Retry)
    drafts: Drafts = Field(default_factory=Drafts)
    watch: Watch = Field(default_factory=Watch)
    reevaluation_seconds: float = Field(
        10.0, alias="reevaluationSeconds", gt=0, le=600, description="in (0, 600]"
    )

    def placer_settings(self) -> PlacerSettings:
        """What the core's placer reads of this policy (the decision's one view of it)."""
        return PlacerSettings(
            gamma_max=self.gamma_max,
            margin=self.self_benefit_margin,
            headroom_uncertainty=self.telemetry.headroom_uncertainty,
            externality=self.externality,
            slo_margin=self.neighbour_slo_margin,
            jurisdiction_label=self.sovereignty.jurisdiction_label,
            keep_whole_nodes_free=self.placement.keep_whole_nodes_free,
            pack=self.placement.pack_shared_work,
            pack_tolerance=self.placement.pack_tolerance,
        )


def parse_policy(name: str, spec: object) -> PolicySpec:
    """Validate a policy's spec; raises ValueError with one line per bad field."""
    try:
        return PolicySpec.model_validate(spec or {})
    except ValidationError as exc:
        raise ValueError(describe(exc, PolicySpec, where=f"{KIND} {name}")) from exc
