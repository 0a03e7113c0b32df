"""The bar of the 50,000-step protocol (docs/learning/experiment-63.md), from committed results.

    python benchmarks/bar.py                     # this bar, both measures
    python benchmarks/bar.py --protocol 20k      # the earlier 20,000-step bar

Rows: ``cbop-50k`` (the CPU preset at each set's offline psi, 50,000 CBOP steps) and
``<algo>-50k`` for each baseline (as many gradient steps as CBOP's whole pipeline), every row
at :data:`~cbop_torchrl.evaluation.protocol.LONG_SEEDS` seeds on the set's current file. A
run's final is the mean of its last 4 evaluations (``rows.json``'s ``final``); every lead is
printed beside its resolution (Welch's t over the seeds,
:func:`~cbop_torchrl.evaluation.protocol.resolution`), since a difference inside it is not
claimed. The conditions:

1. CBOP's final is at least every baseline's, on every set;
2. at least the best baseline's + :data:`MARGIN`, on at least :data:`MARGIN_SETS` set;
3. at least its own BC start (the mean over seeds of the step-0 evaluation), on every set;
4. Q - MC < 0 at the end, on every seed.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.cbop_row import (
    SETS,
    Check,
    conservatism_check,
    current_file,
    find_row,
    load_rows,
    seed_summaries,
)
from cbop_torchrl.evaluation.protocol import LONG_SEEDS, LONG_STEPS, LONG_SUFFIX, resolution
from cbop_torchrl.evaluation.summaries import BASELINES

CBOP_ROW = "cbop" + LONG_SUFFIX
BASELINE_ROWS = tuple(name + LONG_SUFFIX for name in BASELINES)
MARGIN = 5.0
MARGIN_SETS = 1
SEEDS = LONG_SEEDS


def _curve(summary: dict, measure: str) -> list[list[float]]:
    return summary["curve"] if measure == "reset" else summary["start_states"]["curve"]


def bc_start(summaries: list[dict], measure: str) -> float | None:
    """The mean over seeds of the step-0 evaluation (the BC actor CBOP starts from)."""
    starts = [p[1] for s in summaries for p in _curve(s, measure) if int(p[0]) == 0]
    return statistics.fmean(starts) if starts else None


def _resolution_text(cbop: dict, other: dict) -> str:
    found = resolution(cbop.get("final_per_seed") or [], other.get("final_per_seed") or [])
    return "no resolution (a row of one seed)" if found is None else f"resolution {found:.1f}"


def check_set(results: Path, dataset: str, measure: str) -> tuple[list[Check], float]:
    """The set's conditions and CBOP's lead over its best baseline (-inf when a row is missing)."""
    rows = load_rows(results, dataset)
    if rows is None:
        return [Check(dataset, "rows", False, "no rows.json")], float("-inf")
    file = current_file(rows)
    found = {name: find_row(rows, name, measure) for name in (CBOP_ROW, *BASELINE_ROWS)}
    checks = []
    for name, row in found.items():
        seeds = len(row["seeds"]) if row else 0
        checks.append(
            Check(dataset, f"{name}: {SEEDS} seeds", seeds >= SEEDS, f"{seeds} on this measure")
        )
    summaries = seed_summaries(results, dataset, CBOP_ROW, file)
    last_steps = sorted({int(_curve(s, measure)[-1][0]) for s in summaries if _curve(s, measure)})
    checks.append(
        Check(
            dataset,
            f"{CBOP_ROW}: {LONG_STEPS:,} steps",
            bool(last_steps) and min(last_steps) >= LONG_STEPS,
            f"last evaluation at {', '.join(f'{s:,}' for s in last_steps) or 'none'}",
        )
    )
    cbop = found[CBOP_ROW]
    present = {name: row for name, row in found.items() if row and name != CBOP_ROW}
    if cbop is None or not present:
        return checks, float("-inf")
    best = max(present, key=lambda name: present[name]["final"])
    lead = cbop["final"] - present[best]["final"]
    checks.append(
        Check(
            dataset,
            "at least every baseline",
            lead >= 0,
            f"{CBOP_ROW} {cbop['final']:.1f}, best baseline {best} {present[best]['final']:.1f} "
            f"(lead {lead:+.1f}; {_resolution_text(cbop, present[best])})",
        )
    )
    start = bc_start(summaries, measure)
    checks.append(
        Check(
            dataset,
            "at least its BC start",
            start is not None and cbop["final"] >= start,
            "no step-0 evaluation"
            if start is None
            else f"{cbop['final']:.1f} against the step-0 mean {start:.1f}",
        )
    )
    gaps = [s.get("analysis", {}).get("conservatism", {}).get("overestimation") for s in summaries]
    checks.append(conservatism_check(dataset, gaps))
    return checks, lead


def check_long_bar(results: Path, measure: str) -> list[Check]:
    """Every condition of the 50,000-step bar, set by set, then the margin over the sets."""
    checks, leads = [], []
    for dataset in SETS:
        set_checks, lead = check_set(results, dataset, measure)
        checks += set_checks
        leads.append(lead)
    ahead = sum(lead >= MARGIN for lead in leads)
    shown = ", ".join("n/a" if lead == float("-inf") else f"{lead:+.1f}" for lead in leads)
    checks.append(
        Check(
            "all sets",
            f"best baseline + {MARGIN:g} on {MARGIN_SETS} set",
            ahead >= MARGIN_SETS,
            f"on {ahead} (leads: {shown})",
        )
    )
    return checks
