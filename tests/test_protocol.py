"""cbop_torchrl.evaluation.protocol: the final window per row and the resolution between rows."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from cbop_torchrl.evaluation.analysis import row_intervals
from cbop_torchrl.evaluation.protocol import (
    final_window,
    resolution,
    seed_se,
    t_interval,
    t_quantile,
    welch_df,
)


@pytest.mark.parametrize("df", [1, 2, 2.5, 3.7, 4, 8, 17.3, 120])
def test_the_t_quantile_is_students(df: float) -> None:
    for p in (0.9, 0.975, 0.995):
        assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-8)


def test_the_resolution_is_welchs_t_over_the_seeds() -> None:
    a, b = [10.0, 14.0, 12.0, 20.0, 9.0], [5.0, 6.0, 5.5, 7.0]
    se_a, se_b = seed_se(a), seed_se(b)
    welch = stats.ttest_ind(a, b, equal_var=False)
    assert welch_df(se_a, len(a), se_b, len(b)) == pytest.approx(welch.df, rel=1e-9)
    expected = stats.t.ppf(0.975, welch.df) * math.hypot(se_a, se_b)
    assert resolution(a, b) == pytest.approx(expected, rel=1e-8)
    # |mean difference| beyond the resolution exactly when Welch's two-sided p < 0.05.
    difference = sum(a) / len(a) - sum(b) / len(b)
    assert (abs(difference) > resolution(a, b)) == (welch.pvalue < 0.05)


def test_a_row_of_one_seed_has_no_resolution() -> None:
    assert seed_se([12.8]) is None
    assert resolution([12.8], [20.0, 21.0, 19.0]) is None
    assert t_interval([12.8]) is None


def test_long_rows_average_their_last_four_evaluations() -> None:
    assert final_window("cbop-50k") == 4 and final_window("iql-50k") == 4
    assert final_window("cbop-psi5") == 3
    curve = [[2500 * i, float(i)] for i in range(21)]  # 0, 2,500, ..., 50,000
    summaries = [
        {"dataset": "d", "variant": variant, "seed": seed, "curve": curve}
        for variant in ("cbop-50k", "cbop")
        for seed in (0, 1)
    ]
    rows = {row["variant"]: row for row in row_intervals(summaries, reps=100)}
    assert rows["cbop-50k"]["final"] == pytest.approx((17 + 18 + 19 + 20) / 4)
    assert rows["cbop-50k"]["final_window"] == 4
    assert rows["cbop"]["final"] == pytest.approx((18 + 19 + 20) / 3)


def test_a_runs_final_is_the_rows_per_seed_final() -> None:
    """``run_final`` (the report's headline cells) is what ``rows.json`` holds per seed."""
    from cbop_torchrl.evaluation.protocol import final_scores, run_final

    curve = [[2500 * i, float(i * i % 7)] for i in range(21)][::-1]  # out of step order
    assert final_scores(curve, "cbop-50k") == [float(i * i % 7) for i in range(17, 21)]
    assert final_scores(curve, "bc") == [float(i * i % 7) for i in range(18, 21)]
    summaries = [
        {"dataset": "d", "variant": v, "seed": 0, "curve": curve} for v in ("bc-50k", "bc")
    ]
    rows = {row["variant"]: row for row in row_intervals(summaries, reps=10)}
    for variant in ("bc-50k", "bc"):
        assert rows[variant]["final_per_seed"] == [run_final(curve, variant)]
    assert run_final(curve, "bc-50k") != run_final(curve, "bc")
