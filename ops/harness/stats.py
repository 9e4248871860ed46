"""The arithmetic every summary repeats: percentiles, seconds as milliseconds, error kinds,
ratios that stay None when a side is missing. Pure Python."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol


class Outcome(Protocol):
    ok: bool
    error: str | None


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(seconds: float | None, digits: int = 2) -> float | None:
    """Seconds as milliseconds, rounded; None stays None."""
    return None if seconds is None else round(1000.0 * seconds, digits)


def error_kinds(results: Iterable[Outcome]) -> dict[str, int]:
    """How many failed results of each error (its first 160 characters)."""
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = (r.error or "unknown")[:160]
            errors[key] = errors.get(key, 0) + 1
    return errors


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    """a / b rounded, None when either is missing or b is 0."""
    return round(a / b, digits) if a is not None and b else None
