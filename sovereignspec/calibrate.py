"""`sovereignspec calibrate MEASUREMENTS.csv --gpu G --model M`: fit a GPU profile to measured steps.

The CSV has a header row `batch,context,query_tokens,step_ms` (and optionally `draft_ms`); lines
starting with `#` are comments, and a `# source: …` line names where the data comes from. The
command prints (or writes, with `--out`) the GPU's profile with the fitted coefficients and a
`calibration` block: the data file, its source, the rows, and the fit's errors.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sovereignspec.core.calibration import Fit, Measurement, fit
from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.specs import GpuSpec, ModelSpec
from sovereignspec.errors import ConfigError, describe

COLUMNS = ("batch", "context", "query_tokens", "step_ms")


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    batch: float = Field(gt=0, description="sequences in the step, > 0")
    context: float = Field(gt=0, description="mean context tokens per sequence, > 0")
    query_tokens: float = Field(ge=1, description="query tokens per sequence, >= 1 (1 = plain decode)")
    step_ms: float = Field(gt=0, description="the step's wall time in ms, > 0")
    draft_ms: float | None = Field(default=None, ge=0, description="drafting time in ms, >= 0, or empty")
    model: str | None = Field(default=None, description="the row's target model, if not --model")


def read_measurements(path: Path) -> tuple[list[Measurement], str]:
    """The rows of a measurements CSV and its `# source:` line ('' if none)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    source = ""
    body = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            if not source and line.lstrip("# ").lower().startswith("source:"):
                source = line.lstrip("# ")[len("source:") :].strip()
            continue
        if line.strip():
            body.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(
            f"{path}: header {reader.fieldnames}: missing column(s) {missing}; "
            f"accepted: {', '.join(COLUMNS)} and optionally draft_ms, model"
        )
    rows = []
    for number, raw in enumerate(reader, start=2):
        values = {k: (v if v not in ("", None) else None) for k, v in raw.items() if k}
        try:
            row = Row.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(describe(exc, Row, where=f"{path}: data row {number - 1}")) from exc
        rows.append(
            Measurement(
                row.batch,
                row.context,
                row.query_tokens,
                row.step_ms / 1e3,
                None if row.draft_ms is None else row.draft_ms / 1e3,
                row.model,
            )
        )
    if not rows:
        raise ConfigError(f"{path}: no measurements")
    return rows, source


def calibrate(
    gpu: GpuSpec,
    model: ModelSpec,
    rows: list[Measurement],
    tp: int | None = None,
    others: dict[str, ModelSpec] | None = None,
) -> tuple[Fit, int]:
    tp = tp or tensor_parallel_for(gpu, model)
    try:
        return fit(gpu, model, tp, rows, others), tp
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def split_fixed(
    result: Fit, model: ModelSpec, tp: int, step_overhead_ms: float | None
) -> tuple[float, float | None]:
    """(step overhead ms, all-reduce µs or None to keep the profile's).

    The fit sees one fixed cost per step. At TP 1 that is the step overhead. At TP > 1 it also holds
    2·layers all-reduces; given the step overhead (measured elsewhere, e.g. at TP 1), the rest is
    their latency."""
    if step_overhead_ms is None or tp == 1:
        return result.step_overhead_s * 1e3, None
    allreduces = 2.0 * model.layers
    rest_ms = max(result.fixed_s * 1e3 - step_overhead_ms, 0.0)
    return step_overhead_ms, 1e3 * rest_ms / allreduces


def profile_document(
    gpu_file: dict[str, Any],
    result: Fit,
    model: str,
    tp: int,
    data: str,
    source: str,
    rows: int,
    step_overhead_ms: float | None = None,
    allreduce_us: float | None = None,
) -> dict[str, Any]:
    """The GPU profile `gpu_file` (its YAML mapping) with the fitted coefficients and their record."""
    doc = dict(gpu_file)
    overhead = result.step_overhead_s * 1e3 if step_overhead_ms is None else step_overhead_ms
    if allreduce_us is not None:
        doc["allreduce_us"] = round(allreduce_us, 2)
    doc.update(
        measured=True,
        compute_efficiency=round(result.compute_efficiency, 4),
        bandwidth_efficiency=round(result.bandwidth_efficiency, 4),
        step_overhead_ms=round(overhead, 4),
        serial_fraction=round(result.serial_fraction, 4),
        overlap=round(result.overlap, 3),
        calibration={
            "data": data,
            "source": source or "not stated",
            "model": model,
            "tensor_parallel": tp,
            "rows": rows,
            "rms_error_pct": round(100 * result.rms_error, 2),
            "max_error_pct": round(100 * result.max_error, 2),
            "fixed_ms": round(result.fixed_s * 1e3, 4),
        },
    )
    return doc


def render(doc: dict[str, Any], result: Fit) -> str:
    header = (
        f"# {doc.get('name')}: coefficients fitted by `sovereignspec calibrate` "
        f"(rms error {100 * result.rms_error:.1f} %, max {100 * result.max_error:.1f} %).\n"
    )
    if result.drafter_relative_cost is not None:
        header += (
            f"# The data's drafting time fits a relative cost of {result.drafter_relative_cost:.4f} "
            "per drafted token (see the drafter profile).\n"
        )
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)
