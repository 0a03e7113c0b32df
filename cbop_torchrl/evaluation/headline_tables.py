"""The headline tables: per protocol, one row per algorithm and one column per set.

Two protocols, two tables, the 50,000-step one first (:func:`headline_page`):

- :func:`long_headline_markdown`: the 50,000-step protocol's rows (``cbop-50k``, ``bc-50k``,
  ...), each cell the row's final by that protocol's statistic (the mean over seeds of each
  run's mean of its last :data:`~cbop_torchrl.evaluation.protocol.LONG_FINAL_WINDOW`
  evaluations, :func:`~cbop_torchrl.evaluation.protocol.run_final`), the lowest and highest
  seed's final and the seeds run of the protocol's. Its per-seed finals come from the runs'
  summaries (:func:`long_finals`, the report) or from ``rows.json``'s ``final_per_seed``
  (:func:`rows_finals`, the docs' tables), which the same function made;
- :func:`headline_markdown`: the earlier protocol's rows (20,000 CBOP steps, each run's final
  the mean of its last :data:`~cbop_torchrl.evaluation.protocol.EARLIER_FINAL_WINDOW`
  evaluations), CBOP's the set's offline psi choice
  (:func:`~cbop_torchrl.evaluation.headline.headline_rows`).

Both are deterministic: the same summaries give the same text (the docs are checked against
the report's ``headline.md``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cbop_torchrl.evaluation.headline import (
    HEADLINE_ALGOS,
    SETS,
    find_row,
    headline_of,
    load_rows,
)
from cbop_torchrl.evaluation.protocol import (
    EARLIER_FINAL_WINDOW,
    EARLIER_SEEDS,
    EARLIER_STEPS,
    LONG_FINAL_WINDOW,
    LONG_SEEDS,
    LONG_STEPS,
    LONG_SUFFIX,
    run_final,
)
from cbop_torchrl.evaluation.summaries import ALGO_NAMES, group_runs

NOT_RUN = "not run"
"""A cell of a row with no run on that set."""


def headline_markdown(
    summaries: Sequence[dict[str, Any]],
    headline: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """Algorithm x dataset: each headline row's final score, the behaviour policy's.

    A cell is the mean over seeds of the runs' final scores (each the mean of its last
    :data:`~cbop_torchrl.evaluation.summaries.FINAL_EVALUATIONS`
    evaluations; the highest of a column in bold), then in words the
    lowest and highest seed's and the number of seeds; the last rows are the data's
    behaviour policy and its size.

    Args:
        summaries: from :func:`~cbop_torchrl.evaluation.summaries.load_summaries`.
        headline: dataset -> algorithm -> the variant that is the algorithm's row there
            (:func:`~cbop_torchrl.evaluation.headline.headline_rows`: e.g. CBOP's psi chosen
            offline, ``cbop-psi5``); each CBOP cell then names its psi. Default, and for an
            algorithm or set it does not name: the algorithm's own name (``cbop``, ``bc``).

    Deterministic: the same summaries give the same text (the docs are checked against it).
    """
    groups = group_runs(summaries)
    datasets = sorted({d for d, _ in groups})

    def runs_of(dataset: str, algo: str) -> list[dict[str, Any]] | None:
        return groups.get((dataset, headline_of(headline, dataset)[algo]))

    variants = [a for a in HEADLINE_ALGOS if any(runs_of(d, a) for d in datasets)]
    if not datasets or not variants:
        return ""
    lines = [
        "| algorithm | " + " | ".join(datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    best = {
        d: max(
            statistics.fmean(float(r["final_normalized_score"]) for r in runs_of(d, v))
            for v in variants
            if runs_of(d, v)
        )
        for d in datasets
        if any(runs_of(d, v) for v in variants)
    }
    for variant in variants:
        cells, steps = [], set()
        for dataset in datasets:
            runs = runs_of(dataset, variant)
            if not runs:
                cells.append(NOT_RUN)
                continue
            scores = [float(r["final_normalized_score"]) for r in runs]
            steps |= {int(r["gradient_steps"]) for r in runs}
            mean = statistics.fmean(scores)
            cell = f"**{mean:.1f}**" if mean == best[dataset] else f"{mean:.1f}"
            notes = []
            if variant == "cbop" and headline is not None:
                notes.append(_psi_note(runs))
            if len(scores) > 1:
                notes.append(f"seeds {min(scores):.1f} to {max(scores):.1f}; {len(scores)} seeds")
            else:
                notes.append("1 seed")
            cells.append(f"{cell} ({'; '.join(notes)})")
        budget = "/".join(f"{s:,}" for s in sorted(steps))
        name = f"{ALGO_NAMES.get(variant, variant)} ({budget} steps)"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    shown = {(d, headline_of(headline, d)[a]) for d in datasets for a in variants}
    behaviour, sizes = [], []
    for dataset in datasets:
        found = [
            s.get("dataset_provenance") or {}
            for s in summaries
            if s["dataset"] == dataset and (dataset, s["variant"]) in shown
        ]
        p = next((p for p in found if p), {})
        score = p.get("policy_normalized_score")
        behaviour.append("" if score is None else f"{float(score):.1f}")
        n, episodes = p.get("transitions"), p.get("episodes")
        sizes.append(
            "" if n is None else f"{int(n):,} transitions, {int(episodes or 0):,} episodes"
        )
    lines.append("| *behaviour policy (medium)* | " + " | ".join(behaviour) + " |")
    lines.append("| *data* | " + " | ".join(sizes) + " |")
    return "\n".join(lines) + "\n"


def _psi_note(runs: Sequence[dict[str, Any]]) -> str:
    """``psi 5`` (or ``psi 2/5`` where the runs differ): the psi CBOP's runs trained with."""
    psis = {(r.get("diagnostics") or {}).get("settings", {}).get("psi") for r in runs}
    return "psi " + "/".join(f"{p:g}" for p in sorted(psis - {None}))


def long_finals(
    summaries: Sequence[dict[str, Any]], long_headline: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, list[float]]]:
    """``dataset -> algo -> per-seed finals`` of the 50,000-step rows, from the summaries.

    Args:
        summaries: from :func:`~cbop_torchrl.evaluation.summaries.load_summaries` (an earlier
            file's runs renamed, so a row holds the set's current file's runs only).
        long_headline: dataset -> algorithm -> its row
            (:func:`~cbop_torchrl.evaluation.headline.long_headlines_in`); its order is the
            table's columns'.

    Each run's final is :func:`~cbop_torchrl.evaluation.protocol.run_final` of its ``curve``
    (the reset measure) by its row's window, in seed order: ``rows.json``'s
    ``final_per_seed`` (a run without a curve is left out there and here), never the
    summary's ``final_normalized_score`` (the last 3 evaluations whatever the row).
    """
    groups = group_runs(summaries)
    return {
        dataset: {
            algo: [
                run_final(run["curve"], variant)
                for run in groups.get((dataset, variant), [])
                if run.get("curve")
            ]
            for algo, variant in rows.items()
        }
        for dataset, rows in long_headline.items()
    }


def rows_finals(results: Path, datasets: Sequence[str] = SETS) -> dict[str, dict[str, list[float]]]:
    """``dataset -> algo -> per-seed finals`` of the 50,000-step rows from each set's
    ``<results>/<set>/rows.json`` (``final_per_seed`` of the row's reset measure on the set's
    current file); an algorithm whose row is not there, or a set without a ``rows.json``,
    has none."""
    finals: dict[str, dict[str, list[float]]] = {}
    for dataset in datasets:
        rows = load_rows(results, dataset)
        finals[dataset] = {}
        for algo in HEADLINE_ALGOS:
            row = find_row(rows, algo + LONG_SUFFIX, "reset") if rows else None
            finals[dataset][algo] = list(row["final_per_seed"]) if row else []
    return finals


def long_budgets() -> dict[str, int]:
    """``algo -> gradient steps`` under the 50,000-step protocol: CBOP's stage
    :data:`~cbop_torchrl.evaluation.protocol.LONG_STEPS`, each baseline as many as CBOP's
    whole pipeline (the CPU preset's BC and FQE steps before it)."""
    from cbop_torchrl.baselines import preset_training

    preset = preset_training("cpu")
    pretraining = preset["bc.steps"] + preset["fqe.steps"]
    return {algo: LONG_STEPS + (0 if algo == "cbop" else pretraining) for algo in HEADLINE_ALGOS}


def long_headline_markdown(finals: Mapping[str, Mapping[str, Sequence[float]]]) -> str:
    """The 50,000-step protocol's headline: algorithm x set.

    Args:
        finals: dataset -> algorithm -> ``[seeds]`` per-seed finals (:func:`long_finals` or
            :func:`rows_finals`); the columns in its order.

    A cell is the row's final (the mean of its per-seed finals), then the lowest and highest
    seed's (with two seeds or more) and ``n of`` :data:`~cbop_torchrl.evaluation.protocol.
    LONG_SEEDS` seeds; :data:`NOT_RUN` where the row has no run on the set.
    """
    datasets = list(finals)
    budgets = long_budgets()
    lines = ["| algorithm | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    for algo in HEADLINE_ALGOS:
        cells = []
        for dataset in datasets:
            values = [float(v) for v in finals[dataset].get(algo) or []]
            if not values:
                cells.append(NOT_RUN)
                continue
            seeds = f"{len(values)} of {LONG_SEEDS} seeds"
            spread = f"seeds {min(values):.1f} to {max(values):.1f}; " if len(values) > 1 else ""
            cells.append(f"{statistics.fmean(values):.1f} ({spread}{seeds})")
        name = f"{ALGO_NAMES.get(algo, algo)} ({budgets[algo]:,} steps)"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


LONG_TITLE = (
    f"**The {LONG_STEPS:,}-step protocol** (CBOP {LONG_STEPS:,} steps, {LONG_SEEDS} seeds a "
    f"row): each row's final normalized score, the mean over its seeds of each run's mean of "
    f"its last {LONG_FINAL_WINDOW} evaluations; in parentheses the lowest and highest seed's "
    "final and the seeds run:"
)
"""The line above the 50,000-step table in the report."""
EARLIER_TITLE = (
    f"**The earlier protocol** ({EARLIER_STEPS:,} CBOP steps, {EARLIER_SEEDS} seeds a row): "
    f"each row's final normalized score, the mean over its seeds of each run's mean of its "
    f"last {EARLIER_FINAL_WINDOW} evaluations; in parentheses the lowest and highest seed's "
    "and the number of seeds; bold: a column's best:"
)
"""The line above the 20,000-step table in the report."""


def headline_page(long_table: str, earlier_table: str) -> str:
    """A results folder's ``headline.md``: the 50,000-step table (:func:`long_headline_markdown`)
    under :data:`LONG_TITLE`, then the earlier protocol's (:func:`headline_markdown`) under
    :data:`EARLIER_TITLE`."""
    return f"{LONG_TITLE}\n\n{long_table}\n{EARLIER_TITLE}\n\n{earlier_table}"


__all__ = [
    "EARLIER_TITLE",
    "LONG_TITLE",
    "NOT_RUN",
    "headline_markdown",
    "headline_page",
    "long_budgets",
    "long_finals",
    "long_headline_markdown",
    "rows_finals",
]
