"""The fuzzer's budget: --fuzz-budget examples per property (seeded, derandomized)."""

import pytest
from hypothesis import HealthCheck, settings


@pytest.fixture
def fuzz_settings(request):
    budget = request.config.getoption("--fuzz-budget")
    return settings(max_examples=max(1, budget), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
