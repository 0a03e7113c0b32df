"""The statistic rows are judged by: each row's final window and the resolution between rows.

A run's *final* is the mean of its last few evaluations; how many depends on the protocol its
row was made under (:func:`final_window`): the 50,000-step protocol (rows ``<name>-50k``,
an evaluation every 2,500 steps) takes the last 4, the last 10,000 steps; the earlier
20,000-step protocol takes the last :data:`EARLIER_FINAL_WINDOW`.

Two rows differ only beyond their *resolution* (:func:`resolution`),
``t(0.975, df) * sqrt(se_a^2 + se_b^2)``: each ``se`` the standard error of the row's final
over its seeds, ``df`` Welch's. A row of one seed has no standard error over seeds, so no
resolution: the functions return None rather than fall back to a within-run spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

EARLIER_FINAL_WINDOW = 3
"""The earlier protocol's final (20,000 steps, an evaluation every 1,000): the last 3."""
EARLIER_STEPS = 20_000
"""CBOP's gradient steps under the earlier protocol."""
EARLIER_SEEDS = 3
"""Seeds per row under the earlier protocol (0-2; ``benchmarks/bar.py --protocol 20k``)."""
LONG_SUFFIX = "-50k"
"""Rows of the 50,000-step protocol are named ``<variant>-50k`` (``--label 50k``)."""
LONG_FINAL_WINDOW = 4
"""The 50,000-step protocol's final: the last 4 evaluations (2,500 steps apart)."""
LONG_STEPS = 50_000
"""CBOP's gradient steps under the 50,000-step protocol."""
LONG_SEEDS = 5
"""Seeds per row under the 50,000-step protocol (0-4)."""


def is_long_row(variant: str) -> bool:
    """Whether ``variant`` is a row of the 50,000-step protocol (``cbop-50k``, ``iql-50k``)."""
    return variant.endswith(LONG_SUFFIX)


def final_window(variant: str) -> int:
    """How many of a run's last evaluations its final averages, by its row's protocol."""
    return LONG_FINAL_WINDOW if is_long_row(variant) else EARLIER_FINAL_WINDOW


def final_scores(curve: Sequence[Sequence[float]], variant: str) -> list[float]:
    """The evaluations a run's final averages: the last :func:`final_window` of its row's.

    Args:
        curve: ``[[step, score], ...]`` (a summary's ``curve``), in any order.
        variant: the run's row (``cbop-50k``: the last 4; ``cbop-psi5``: the last 3).

    Returns:
        The scores of the last ``final_window(variant)`` evaluations by step, oldest first.
    """
    points = sorted(curve, key=lambda point: point[0])[-final_window(variant) :]
    return [float(score) for _, score in points]


def run_final(curve: Sequence[Sequence[float]], variant: str) -> float:
    """A run's final by its row's protocol: the mean of :func:`final_scores` (``rows.json``'s
    ``final_per_seed`` holds one per seed). Raises ``StatisticsError`` on an empty curve."""
    return statistics.fmean(final_scores(curve, variant))


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile ``t(p, df)`` for ``0.5 <= p < 1`` and any real ``df > 0``.

    Bisection on the CDF, which is ``1 - I_x(df/2, 1/2) / 2`` with ``x = df / (df + t^2)``
    (:func:`_incomplete_beta`); accurate to about 1e-9, enough for a resolution.
    """
    if not 0.5 <= p < 1 or not df > 0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2
        if _t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def _t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for ``t >= 0``."""
    x = df / (df + t * t)
    return 1.0 - 0.5 * _incomplete_beta(df / 2, 0.5, x)


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def seed_se(values: Sequence[float]) -> float | None:
    """The standard error of the mean of per-seed finals (None with fewer than 2 seeds)."""
    if len(values) < 2:
        return None
    return statistics.stdev(values) / math.sqrt(len(values))


def welch_df(se_a: float, n_a: int, se_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two means."""
    total = se_a**2 + se_b**2
    parts = se_a**4 / (n_a - 1) + se_b**4 / (n_b - 1)
    if parts == 0.0:  # both rows without spread: the smallest of the two dfs
        return float(min(n_a, n_b) - 1)
    return total**2 / parts


def resolution(values_a: Sequence[float], values_b: Sequence[float]) -> float | None:
    """How far two rows' finals must be apart to differ: ``t(0.975, df) sqrt(se_a^2 + se_b^2)``.

    Args:
        values_a: ``[n_a]`` per-seed finals of one row.
        values_b: ``[n_b]`` per-seed finals of the other.

    Returns:
        The resolution, or None where either row has fewer than 2 seeds.
    """
    se_a, se_b = seed_se(values_a), seed_se(values_b)
    if se_a is None or se_b is None:
        return None
    df = welch_df(se_a, len(values_a), se_b, len(values_b))
    return t_quantile(0.975, df) * math.sqrt(se_a**2 + se_b**2)


def self_resolution(values: Sequence[float]) -> float | None:
    """:func:`resolution` of a row against a row with the same seeds' spread and count."""
    return resolution(values, values)


def t_interval(values: Sequence[float]) -> list[float] | None:
    """The 95% Student-t interval of the mean of per-seed ``values`` (None with fewer than 2)."""
    se = seed_se(values)
    if se is None:
        return None
    half = t_quantile(0.975, len(values) - 1) * se
    mean = statistics.fmean(values)
    return [mean - half, mean + half]


__all__ = [
    "EARLIER_FINAL_WINDOW",
    "EARLIER_SEEDS",
    "EARLIER_STEPS",
    "LONG_FINAL_WINDOW",
    "LONG_SEEDS",
    "LONG_STEPS",
    "LONG_SUFFIX",
    "final_scores",
    "final_window",
    "is_long_row",
    "resolution",
    "run_final",
    "seed_se",
    "self_resolution",
    "t_interval",
    "t_quantile",
    "welch_df",
]
