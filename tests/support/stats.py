"""Pearson's chi-square test that two samples come from one distribution (no scipy in the venv).

`homogeneity(a, b)` tests a 2 x K table of counts, pooling the categories too rare for the test
(an expected count under 5, the textbook rule) into one; `chi2_sf` is the chi-square survival
function, the regularized upper incomplete gamma Q(df / 2, x / 2), by its power series below
a + 1 and its continued fraction above (Numerical Recipes' gser / gcf, to 1e-12).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable

MIN_EXPECTED = 5.0


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with `df` degrees of freedom."""
    if x <= 0:
        return 1.0
    a, z = df / 2.0, x / 2.0
    log_prefix = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:  # P(a, z) by its series; Q = 1 - P
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-12:
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    # Q(a, z) by Lentz's continued fraction
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    i = 1
    while True:
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-12:
            return h * math.exp(log_prefix)
        i += 1


def homogeneity(a: Iterable[Hashable], b: Iterable[Hashable]) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of "samples `a` and `b` share a distribution"."""
    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    total = na + nb
    common: list[tuple[int, int]] = []
    rare = (0, 0)
    for key in ca.keys() | cb.keys():
        x, y = ca[key], cb[key]
        if min(na, nb) * (x + y) / total < MIN_EXPECTED:
            rare = (rare[0] + x, rare[1] + y)
        else:
            common.append((x, y))
    if sum(rare):
        common.append(rare)
    if len(common) < 2:
        return 0.0, 0, 1.0
    statistic = 0.0
    for x, y in common:
        for observed, n in ((x, na), (y, nb)):
            expected = n * (x + y) / total
            statistic += (observed - expected) ** 2 / expected
    df = len(common) - 1
    return statistic, df, chi2_sf(statistic, df)
