"""`sovereignspec calibrate`: the fit, the command, the shipped profiles it wrote, and one home for
the step-time arithmetic."""

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from sovereignspec.analysis.predict import predict
from sovereignspec.core.calibration import Measurement, fit
from sovereignspec.core.roofline import roofline_for, tensor_parallel_for
from sovereignspec.core.scalar import Coeffs
from tests.unit.test_cli import run

REPO = Path(__file__).resolve().parents[2]


M = "profiles/measurements/"


@pytest.mark.parametrize(
    ("profile", "command"),
    [
        (
            "gpus/h100-sxm.yaml",
            [
                M + "h100-sxm_llama-3.1-8b_tp1.csv",
                "--held-out",
                M + "h100-sxm_vidur_linear_fit.csv",
                "--held-out",
                M + "h100-sxm_vidur_linear_held_out.csv",
                "--gpu",
                "H100-SXM",
                "--model",
                "llama-3.1-8b",
            ],
        ),
        (
            "gpus/a100-80g-sxm.yaml",
            [
                M + "a100-80g-sxm_magicdec_tp8.csv",
                "--held-out",
                M + "a100-80g-sxm_vidur_linear_fit.csv",
                "--held-out",
                M + "a100-80g-sxm_vidur_linear_held_out.csv",
                "--gpu",
                "A100-80G-SXM",
                "--model",
                "llama-3.1-8b",
                "--tp",
                "8",
                "--step-overhead-ms",
                "2.2817",
            ],
        ),
    ],
)
def test_the_shipped_calibrated_profiles_are_what_calibrate_writes_from_the_shipped_data(profile, command):
    # `make calibrate-profiles` runs these commands; the test holds the shipped files to them.
    makefile = (REPO / "Makefile").read_text().replace("$(M)/", M).replace("\\\n", " ")
    assert " ".join(command[:4]) in " ".join(makefile.split())
    code, out, err = run("calibrate", *command)
    assert code == 0, err
    assert yaml.safe_load(out) == yaml.safe_load((REPO / "profiles" / profile).read_text())


def _synthetic(gpu, model, tp, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    roof = roofline_for(gpu, model, tp)
    rows = []
    for batch in (1, 4, 16, 64, 256):
        for context in (256, 2048, 16384):
            for q in (1, 3, 5):
                t = float(roof.step_time(batch * q, batch, context)) * (1 + noise * rng.standard_normal())
                rows.append(Measurement(batch, context, q, t))
    return rows


def test_the_fit_recovers_the_coefficients_that_generated_the_steps(profiles):
    model = profiles.models["llama-3.1-8b"]
    truth = replace(
        profiles.gpus["L40S"],
        compute_efficiency=0.55,
        bandwidth_efficiency=0.7,
        step_overhead_s=1.5e-3,
        serial_fraction=0.3,
        overlap=3.0,
    )
    start = replace(truth, compute_efficiency=0.9, bandwidth_efficiency=0.9, step_overhead_s=0.0)
    got = fit(start, model, 1, _synthetic(truth, model, 1))
    assert got.rms_error < 1e-3
    assert got.compute_efficiency == pytest.approx(0.55, rel=0.01)
    assert got.bandwidth_efficiency == pytest.approx(0.7, rel=0.01)
    assert got.step_overhead_s == pytest.approx(1.5e-3, rel=0.01)
    assert got.serial_fraction == pytest.approx(0.3, abs=0.01)


def test_the_fit_reports_its_error_honestly_on_noisy_steps(profiles):
    model, gpu = profiles.models["llama-3.1-8b"], profiles.gpus["H100-SXM"]
    got = fit(gpu, model, 1, _synthetic(gpu, model, 1, noise=0.05, seed=3))
    assert 0.02 < got.rms_error < 0.08  # about the noise put in, not zero
    assert got.max_error >= got.rms_error


@pytest.mark.parametrize(
    ("csv_text", "needle"),
    [
        ("batch,context,step_ms\n1,256,7\n", "missing column(s) ['query_tokens']; accepted: batch, context"),
        (
            "batch,context,query_tokens,step_ms\n" + "1,256,1,7\n" * 5 + "-1,256,1,7\n",
            "data row 6: field 'batch': got '-1'",
        ),
        ("batch,context,query_tokens,step_ms\n1,256,1,fast\n", "field 'step_ms': got 'fast'"),
        ("batch,context,query_tokens,step_ms\n1,256,1,7\n", "at least 5 measurements, got 1"),
        ("# only a comment\n", "missing column(s)"),
    ],
)
def test_calibrate_rejects_bad_measurements_naming_the_row_field_and_value(tmp_path, csv_text, needle):
    data = tmp_path / "m.csv"
    data.write_text(csv_text)
    code, _, err = run("calibrate", str(data), "--gpu", "H100-SXM", "--model", "llama-3.1-8b")
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_calibrate_names_a_missing_file(tmp_path):
    code, _, err = run(
        "calibrate", str(tmp_path / "nope.csv"), "--gpu", "H100-SXM", "--model", "llama-3.1-8b"
    )
    assert code == 2 and "nope.csv: cannot read" in err and "Traceback" not in err


def test_calibrate_writes_the_profile_with_its_record_when_asked(tmp_path):
    out = tmp_path / "h100.yaml"
    code, stdout, err = run(
        "calibrate",
        "profiles/measurements/h100-sxm_llama-3.1-8b_tp1.csv",
        "--gpu",
        "H100-SXM",
        "--model",
        "llama-3.1-8b",
        "--out",
        str(out),
    )
    assert code == 0, err
    assert "175 rows" in stdout and "ridge NOT identified" in stdout and str(out) in stdout
    doc = yaml.safe_load(out.read_text())
    assert doc["measured"] is False  # batch 1-64 alone leaves the ridge open (test_ridge.py)
    assert doc["calibration"]["rows"] == 175 and "2601.11580" in doc["calibration"]["source"]


@pytest.mark.parametrize("gpu", ["A100-80G-SXM", "H100-SXM", "H200", "L40S", "RTX-4090"])
@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.3-70b", "llama-2-7b-32k"])
def test_the_scalar_step_is_the_vectorised_step(profiles, gpu, model):
    # One formula: the simulator's and the scalar reference's step time is Roofline.step_time.
    g, m = profiles.gpus[gpu], profiles.models[model]
    tp = tensor_parallel_for(g, m)
    roof, c = roofline_for(g, m, tp), Coeffs.of(g, m, tp)
    for n, s, ctx in [(1, 1, 64), (9, 1, 512), (64, 32, 1024), (1200, 300, 4096), (5000, 900, 16384)]:
        assert c.step(n, s, ctx) == pytest.approx(float(roof.step_time(n, s, ctx)), rel=1e-12)


def test_predict_speedup_falls_strictly_with_the_batch_and_verification_is_not_free(profiles):
    args = (profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"], profiles.drafters["eagle3"])
    rows = [predict(*args, batch=b, context=1024, alpha=0.8, gamma=4) for b in range(1, 65)]
    speedups = [r["speedup"] for r in rows]
    assert all(a > b for a, b in itertools.pairwise(speedups))
    at_32 = rows[31]
    assert at_32["step_verify_ms"] > 1.1 * at_32["step_plain_ms"]
    terms = [k for k in at_32 if k.startswith("verify_") and k.endswith("_ms")]
    assert sum(at_32[k] for k in terms) == pytest.approx(at_32["step_verify_ms"], rel=1e-9)
