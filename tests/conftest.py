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
