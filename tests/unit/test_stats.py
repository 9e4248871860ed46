"""tests/support/stats.py, the chi-square test the speculative sampling test relies on: the
survival function at textbook critical values, and a test that tells samples apart only when
they differ."""

from __future__ import annotations

import random

import pytest

from tests.support.stats import chi2_sf, homogeneity


@pytest.mark.parametrize(
    ("x", "df", "p"),
    [(3.841459, 1, 0.05), (6.634897, 1, 0.01), (11.070498, 5, 0.05), (23.209251, 10, 0.01), (55.758479, 40, 0.05), (0.584375, 3, 0.9)],
)
def test_chi2_survival_at_critical_values(x: float, df: int, p: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(p, rel=1e-5)  # the series below df / 2 + 1, the continued fraction above
    assert chi2_sf(0.0, df) == 1.0


def test_homogeneity_rejects_only_different_distributions() -> None:
    rng = random.Random(7)
    weights = [0.5, 0.3, 0.15, 0.04, 0.01]  # the last two are pooled: too rare for the test alone
    same = [homogeneity(rng.choices(range(5), weights, k=500), rng.choices(range(5), weights, k=500))[2] for _ in range(200)]
    assert 0.01 < sum(p < 0.05 for p in same) / len(same) < 0.1  # about the 5 % a true null rejects (3 % with this seed)
    shifted = [0.45, 0.35, 0.15, 0.04, 0.01]
    assert homogeneity(rng.choices(range(5), weights, k=5000), rng.choices(range(5), shifted, k=5000))[2] < 1e-4
    assert homogeneity("aab", "aab") == (0.0, 0, 1.0)  # nothing common enough to test
