import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

from sovereignspec.core.specs import ProfileSet
from sovereignspec.profiles import load_profiles

# Every run tries the same cases (a law that fails, fails every time, in CI and here), with no
# database carrying one machine's finds into the next run and no deadline for a loaded machine to
# miss. `--hypothesis-seed=N` draws other cases, reproducibly: how the laws are explored.
settings.register_profile("derandomized", derandomize=True, database=None, deadline=None)
settings.register_profile("seeded", database=None, deadline=None)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("hypothesis_profile", None) is not None:
        return
    seeded = config.getoption("hypothesis_seed", None) is not None
    settings.load_profile("seeded" if seeded else "derandomized")


@pytest.fixture(scope="session")
def profiles() -> ProfileSet:
    return load_profiles()


GOQUOTE = Path(__file__).resolve().parent / "data" / "goquote" / "main.go"


@pytest.fixture(scope="session")
def go_quote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kubelet's own formatting (Go's `%q`), built once from tests/data/goquote."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = tmp_path_factory.mktemp("goquote") / "goquote"
    subprocess.run([go, "build", "-o", str(out), str(GOQUOTE)], check=True, timeout=600)
    return out


def go_quoted(go_quote: Path, notes: dict[str, str]) -> bytes:
    return subprocess.run(
        [str(go_quote)], input=json.dumps(notes).encode(), capture_output=True, check=True, timeout=60
    ).stdout
