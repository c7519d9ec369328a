import shutil
from pathlib import Path

import pytest
import yaml

from sovereignspec.errors import ConfigError
from sovereignspec.profiles import default_profile_dir, load_profiles

SHIPPED = default_profile_dir()


def test_shipped_profiles_cover_the_required_gpus_models_and_drafter_kinds(profiles):
    assert {"A100-80G-SXM", "H100-SXM", "H200", "L40S", "RTX-4090"} <= set(profiles.gpus)
    params = sorted(m.params for m in profiles.models.values())
    assert any(7e9 <= p <= 9e9 for p in params) and any(65e9 <= p <= 75e9 for p in params)
    assert len({d.kind for d in profiles.drafters.values()}) >= 2


def test_every_shipped_profile_says_where_its_numbers_come_from_and_only_calibrated_ones_say_measured():
    for path in SHIPPED.rglob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["source"], path
        calibration = doc.get("calibration") or {}
        # Measured: calibrated here, on data that pin the ridge (the A100's MagicDec steps do not).
        measured_here = (
            bool(calibration) and not calibration.get("scaled_from") and calibration["ridge_identified"]
        )
        assert doc["measured"] is measured_here, path
        if calibration:  # the data it was fitted to (and tested on) ships beside the profiles
            held = (calibration.get("held_out") or {}).get("data", [])
            for data in [calibration["data"], held]:
                for f in [data] if isinstance(data, str) else data:
                    assert (SHIPPED.parent / f).is_file() or (
                        SHIPPED / Path(f).relative_to("profiles")
                    ).is_file(), path


FITTED = ("compute_efficiency", "bandwidth_efficiency", "step_overhead_ms", "serial_fraction", "overlap")


def test_a_gpu_scaled_from_a_calibrated_one_carries_exactly_its_fitted_coefficients():
    docs = {d["name"]: d for d in (yaml.safe_load(p.read_text()) for p in (SHIPPED / "gpus").glob("*.yaml"))}
    scaled = [d for d in docs.values() if (d.get("calibration") or {}).get("scaled_from")]
    assert {d["name"] for d in scaled} == {"H200", "L40S", "RTX-4090"}
    for d in scaled:
        reference = docs[d["calibration"]["scaled_from"]]
        assert reference["calibration"] and not reference["calibration"].get("scaled_from")
        assert {k: d[k] for k in FITTED} == {k: reference[k] for k in FITTED}, d["name"]


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "profiles"
    shutil.copytree(SHIPPED, target)
    return target


@pytest.mark.parametrize(
    ("file", "old", "new", "field", "expected"),
    [
        (
            "gpus/h100-sxm.yaml",
            "memory_bandwidth_tbps: 3.35",
            "memory_bandwidth_tbps: 0",
            "memory_bandwidth_tbps",
            "> 0",
        ),
        ("gpus/l40s.yaml", "step_overhead_ms: 2.2817", "step_overhead_ms: -1", "step_overhead_ms", ">= 0"),
        (
            "drafters/eagle3.yaml",
            "drafter_kind: eagle",
            "drafter_kind: telepathy",
            "drafter_kind",
            "eagle, draft-model",
        ),
        ("models/llama-3.1-8b.yaml", "layers: 32\n", "", "layers", "positive integer"),
        (
            "models/llama-3.1-8b.yaml",
            "tensor_parallel: 1",
            "tensor_parallel: 3",
            "tensor_parallel",
            "1, 2, 4, 8, 16",
        ),
    ],
    ids=["zero-bandwidth", "negative-overhead", "unknown-drafter-kind", "missing-field", "odd-tp"],
)
def test_a_bad_profile_fails_naming_file_field_value_and_what_is_accepted(
    tmp_path, file, old, new, field, expected
):
    root = _copy(tmp_path)
    path = root / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_profiles(root)
    message = str(err.value)
    assert str(path) in message and f"'{field}'" in message and expected in message
    if new.strip():
        assert new.split(":")[1].strip() in message  # the offending value


def test_a_drafter_naming_an_unknown_target_model_is_refused(tmp_path):
    root = _copy(tmp_path)
    path = root / "drafters/ngram.yaml"
    path.write_text(path.read_text().replace("targets: []", "targets: [gpt-9]"))
    with pytest.raises(ConfigError, match=r"gpt-9.*llama-3\.1-8b"):
        load_profiles(root)


def test_two_profiles_with_one_name_are_refused(tmp_path):
    root = _copy(tmp_path)
    shutil.copy(root / "gpus/h200.yaml", root / "gpus/h200-copy.yaml")
    with pytest.raises(ConfigError, match="already defined"):
        load_profiles(root)


def test_a_profile_that_is_not_yaml_is_refused_with_its_path(tmp_path):
    root = _copy(tmp_path)
    (root / "gpus/broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML"):
        load_profiles(root)


def test_a_flat_directory_of_profiles_works_like_the_folders(tmp_path):
    for path in SHIPPED.rglob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    flat = load_profiles(tmp_path)
    assert flat == load_profiles(SHIPPED)


def test_a_flat_profile_without_a_known_kind_is_refused(tmp_path):
    (tmp_path / "odd.yaml").write_text("kind: tpu\nname: x\n")
    with pytest.raises(ConfigError, match="'kind': got 'tpu'"):
        load_profiles(tmp_path)
