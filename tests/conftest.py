import pytest

from sovereignspec.core.specs import ProfileSet
from sovereignspec.profiles import load_profiles


@pytest.fixture(scope="session")
def profiles() -> ProfileSet:
    return load_profiles()
