"""CI tries the same hypothesis cases on every run; a seed given on the command line explores others."""

from hypothesis import settings


def test_hypothesis_is_derandomized_unless_a_seed_is_given(request):
    seeded = request.config.getoption("hypothesis_seed", None) is not None
    assert settings.default.derandomize is not seeded
    assert settings.default.database is None
    assert settings.default.deadline is None
