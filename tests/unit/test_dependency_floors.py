"""The lowest versions pyproject.toml allows are enough: a fresh virtualenv with exactly those
floors (from PyPI) imports every module and has the client calls the operator makes.

Slow-ish (one pip install); the floors are read from pyproject.toml itself, so a floor that is too
low for the code fails here, not in a user's cluster."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE = r"""
import inspect, pkgutil, importlib, sovereignspec
for m in pkgutil.walk_packages(sovereignspec.__path__, "sovereignspec."):
    if ".localdev" in m.name or m.name.endswith("__main__"):
        continue  # the dev harness (matplotlib-free, but it needs the local control plane's files)
    importlib.import_module(m.name)
from kubernetes import client
api = client.ApiClient(client.Configuration())
api.configuration.api_key = {"BearerToken": "t"}
api.configuration.api_key_prefix = {"BearerToken": "Bearer"}
method, url, headers, body, _ = api.param_serialize(
    method="GET", resource_path="/api/v1/nodes", query_params=[], header_params={},
    auth_settings=["BearerToken"],
)
assert headers.get("authorization") == "Bearer t", headers
import kopf
assert "identity" in inspect.signature(kopf.run).parameters
from minio import Minio
assert {"retention"} <= set(inspect.signature(Minio.put_object).parameters)
assert {"include_version"} <= set(inspect.signature(Minio.list_objects).parameters)
assert {"credentials", "http_client", "region"} <= set(inspect.signature(Minio).parameters)
print("floors ok")
"""


def _floors() -> list[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = []
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(?:,<[0-9.]+)?", dep.split(";")[0].strip())
        assert m, f"dependency without a floor: {dep}"
        name, floor = m.groups()
        pins.append(f"{name}=={floor}" if name != "nvidia-ml-py" else f"{name}>={floor},<{floor}.999")
    return pins


def test_the_dependency_floors_are_enough(tmp_path: Path) -> None:
    if os.environ.get("SOVEREIGNSPEC_OFFLINE"):
        pytest.skip("SOVEREIGNSPEC_OFFLINE: no package index")
    env_dir = tmp_path / "floors"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    pins = _floors()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    smoke = subprocess.run(
        [str(python), "-c", SMOKE], capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path,
    )  # fmt: skip
    assert smoke.returncode == 0, f"{pins}\n{smoke.stderr[-3000:]}"
    assert "floors ok" in smoke.stdout
