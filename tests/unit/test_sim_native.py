"""The compiled simulator (mypyc, `make sim-native`) is the interpreted one, faster.

It is loaded only while built from the current sources by this interpreter; a stale build falls
back to the Python modules with a warning, never runs old code. One test compiles it (about a
minute on the 2-core machine) and compares whole simulation reports both ways.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sovereignspec import sim

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, native: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, sim.NATIVE_ENV: native}
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )


WHERE = "import sovereignspec.sim as s, sovereignspec.sim.loop as e; print(s.NATIVE); print(e.__file__)"


def _manifest(directory: Path, sources: dict[str, str], python: str = sys.implementation.cache_tag) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sources.json").write_text(json.dumps({"python": python, "sources": sources}))


def test_a_build_from_other_sources_is_not_loaded_and_says_so(tmp_path):
    stale = {**sim.source_digests(), "loop": "0" * 64}
    _manifest(tmp_path, stale)
    out = _python(WHERE, str(tmp_path))
    native, engine = out.stdout.split()
    assert native == "None"
    assert engine == str(ROOT / "sovereignspec" / "sim" / "loop.py")
    assert "built from other sources" in out.stderr and "make sim-native" in out.stderr


def test_a_build_for_another_python_is_not_loaded(tmp_path):
    _manifest(tmp_path, sim.source_digests(), python="cpython-399")
    out = _python(WHERE, str(tmp_path))
    assert out.stdout.split()[0] == "None"
    assert "another Python" in out.stderr


def test_a_current_build_is_searched_first_and_zero_turns_it_off(tmp_path):
    _manifest(tmp_path, sim.source_digests())
    lib = tmp_path / "lib" / "sovereignspec" / "sim"
    assert _python(WHERE, str(tmp_path)).stdout.split()[0] == str(lib)
    assert _python(WHERE, "0").stdout.split()[0] == "None"


def test_a_missing_build_named_in_the_environment_is_reported(tmp_path):
    out = _python(WHERE, str(tmp_path / "nowhere"))
    assert out.stdout.split()[0] == "None"
    assert "no compiled simulator there" in out.stderr


REPORT = """
import json, sys
from sovereignspec.profiles import load_profiles
from sovereignspec.sim.run import run_all
from sovereignspec.sim.scenario import load
import sovereignspec.sim.loop as e
runs = run_all(load(sys.argv[1]), load_profiles(), world=sys.argv[2])
print(json.dumps({"engine": e.__file__, "runs": {k: repr(v) for k, v in runs.items()}}))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: mypyc cannot build the simulator")
def test_the_compiled_simulator_reports_exactly_what_the_interpreted_one_does(tmp_path):
    build = subprocess.run(
        [sys.executable, "hack/build_sim_native.py", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,  # its output goes into the failure message
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for scenario, world in (("heterogeneous", "measured"), ("saturated", "profile")):
        compiled = json.loads(_python(REPORT, str(tmp_path), scenario, world).stdout)
        interpreted = json.loads(_python(REPORT, "0", scenario, world).stdout)
        assert compiled["engine"].endswith(".so") and compiled["engine"].startswith(str(tmp_path))
        assert interpreted["engine"].endswith("loop.py")
        assert compiled["runs"] == interpreted["runs"], scenario


def test_a_mangled_manifest_is_treated_as_a_stale_build(tmp_path):
    (tmp_path / "sources.json").write_text("[1, 2, 3]")
    out = _python(WHERE, str(tmp_path))
    assert out.stdout.split()[0] == "None"
    assert "built from other sources" in out.stderr
