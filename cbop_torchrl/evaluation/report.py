"""The analysis report: tables, the paper's conservatism table, rliable, and its figures.

:func:`write_report` turns run summaries (:func:`~cbop_torchrl.evaluation.summaries.load_summaries`)
into these files:

==============================  =============================================
output                          from
==============================  =============================================
``results.md`` / ``.csv``       final and best normalized score per run
``headline.md``                 the headline table(s) (:func:`headline_markdown`)
``curves_<dataset>.png``        ``curve`` of the headline's rows (:func:`headline_rows`)
``curves_20k_<dataset>.png``    a results folder's earlier protocol's rows (idem)
``curves_all_<dataset>.png``    ``curve`` of every variant (earlier ones too)
``horizon_<dataset>.png``       ``train_curves["cbop/expected_horizon"]``
``targets_<dataset>.png``       ``train_curves``: target mean, critic loss
``rh_<dataset>_<variant>.png``  ``analysis.rh_sample`` (checkpoint needed once)
``share_<dataset>_<variant>``   ``analysis.value_var_share`` (idem)
``conservatism.md`` / ``.csv``  ``analysis.conservatism`` (idem)
``rliable.md`` / ``.png``       final scores; only when ``rliable`` imports
==============================  =============================================

The figures are drawn by :mod:`cbop_torchrl.evaluation.figures`. For a benchmark results
folder (``long_headline``) the headline is the 50,000-step protocol's rows, its table
(:func:`~cbop_torchrl.evaluation.headline_tables.long_headline_markdown`) and
``curves_<dataset>.png``, with the earlier protocol's (20,000 steps) below them and in
``curves_20k_<dataset>.png``; for run and sweep directories, the table of the runs' own
algorithms and ``curves_<dataset>.png``.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cbop_torchrl.evaluation.figures import (
    plot_expected_horizon,
    plot_learning_curves,
    plot_rh_histograms,
    plot_rliable,
    plot_share_histograms,
    plot_target_diagnostics,
)
from cbop_torchrl.evaluation.headline_tables import (
    headline_markdown,
    headline_page,
    long_finals,
    long_headline_markdown,
)
from cbop_torchrl.evaluation.protocol import (
    EARLIER_FINAL_WINDOW,
    EARLIER_STEPS,
    LONG_FINAL_WINDOW,
    LONG_STEPS,
    run_final,
)
from cbop_torchrl.evaluation.summaries import (
    BAR_KEEP,
    BAR_MARGIN,
    BAR_MARGIN_SETS,
    BASELINES,
    FINAL_EVALUATIONS,
    group_runs,
    mean_std,
    variant_order,
)
from cbop_torchrl.io import atomic_write


# ----------------------------------------------------------------------------- tables
def protocol_final(summary: dict[str, Any]) -> float:
    """A run's final by its row's protocol (:func:`~cbop_torchrl.evaluation.protocol.run_final`:
    the last 4 evaluations of a ``-50k`` row, else 3), its summary's stored final without a
    curve."""
    if summary.get("curve"):
        return run_final(summary["curve"], summary["variant"])
    return float(summary["final_normalized_score"])


def score_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, variant): seeds, the final by the row's protocol
    (:func:`protocol_final`) and the best score, mean/std over seeds."""
    rows = []
    for (dataset, variant), runs in group_runs(summaries).items():
        final = mean_std([protocol_final(r) for r in runs])
        best = mean_std([r["best_normalized_score"] for r in runs])
        horizon = [
            r["diagnostics"].get("expected_horizon_end")
            for r in runs
            if r.get("diagnostics", {}).get("expected_horizon_end") is not None
        ]
        rows.append(
            {
                "dataset": dataset,
                "variant": variant,
                "seeds": " ".join(str(r["seed"]) for r in runs),
                "num_seeds": len(runs),
                "gradient_steps": " ".join(sorted({str(r["gradient_steps"]) for r in runs})),
                "final_mean": final[0],
                "final_std": final[1],
                "best_mean": best[0],
                "best_std": best[1],
                "expected_horizon_end": statistics.fmean(horizon) if horizon else None,
            }
        )
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The results table in Markdown (normalized score, mean +- std over seeds)."""
    lines = [
        "| dataset | algorithm | seeds | gradient steps | final score | best score | E[h] (end) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        horizon = row["expected_horizon_end"]
        lines.append(
            f"| {row['dataset']} | {row['variant']} | {row['num_seeds']} ({row['seeds']}) | "
            f"{row['gradient_steps']} | {row['final_mean']:.1f} ± {row['final_std']:.1f} | "
            f"{row['best_mean']:.1f} ± {row['best_std']:.1f} | "
            f"{'' if horizon is None else f'{horizon:.2f}'} |"
        )
    return "\n".join(lines) + "\n"


def _write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as handle:
            if rows:
                writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)

    return atomic_write(path, write)


def file_versions(provenances: Sequence[dict[str, Any]]) -> str:
    """The sha256 of the dataset file the runs read, and whether they read one version.

    Files written by the generator with the same settings (one ``data_key``) hold the same
    data, but their bytes may differ (a copy regenerated elsewhere); that is said, not
    flagged. Different settings are flagged: the runs did not train on the same data.
    """
    shas = sorted({str(p.get("sha256"))[:12] for p in provenances})
    data_keys = {p.get("data_key") for p in provenances}
    if len(shas) == 1:
        return shas[0]
    if len(data_keys) == 1 and None not in data_keys:
        return f"{', '.join(shas)} (files of the same generator settings {data_keys.pop()})"
    return f"{', '.join(shas)} (several versions!)"


def dataset_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """Where each dataset came from (the generator's provenance stored in the summaries)."""
    lines = []
    for dataset in sorted({s["dataset"] for s in summaries}):
        found = [
            s["dataset_provenance"]
            for s in summaries
            if s["dataset"] == dataset and s.get("dataset_provenance")
        ]
        if not found:
            continue
        p = found[0]
        lines.append(
            f"| {dataset} | {p.get('transitions')} | {p.get('episodes')} | "
            f"{_fmt(p.get('episode_normalized_score_mean'))} | "
            f"{_fmt(p.get('policy_normalized_score'))} | `{p.get('command')}` | "
            f"{file_versions(found)} |"
        )
    if not lines:
        return ""
    header = [
        "| dataset | transitions | episodes | mean episode score | behaviour policy score | "
        "generated by | sha256 |",
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(header + lines) + "\n"


def _fmt(value: Any) -> str:
    return "" if value is None else f"{float(value):.1f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{float(value):+.1f}"


def goal_check(
    rows: Sequence[dict[str, Any]], summaries: Sequence[dict[str, Any]] = ()
) -> list[str]:
    """Per dataset, the bar CBOP is held to (``benchmarks/bar.py`` checks it on the sets):

    - its final score (mean over seeds) is at least every baseline's, and at least the best
      baseline's + :data:`BAR_MARGIN` on :data:`BAR_MARGIN_SETS` sets (the last line);
    - every seed's final is at least :data:`BAR_KEEP` of its own best evaluation;
    - Q is below the Monte-Carlo return at the end, on every seed (from ``summaries``'
      ``analysis.conservatism.overestimation``, where they have it).
    """
    lines, ahead, sets = [], 0, 0
    for dataset in sorted({r["dataset"] for r in rows}):
        by_variant = {r["variant"]: r for r in rows if r["dataset"] == dataset}
        # the current baselines only: an earlier file's rows are "<name> (file <sha>)"
        baselines = {v: r["final_mean"] for v, r in by_variant.items() if v in BASELINES}
        if "cbop" not in by_variant or not baselines:
            continue
        best = max(baselines, key=baselines.get)
        cbop = by_variant["cbop"]["final_mean"]
        lead = cbop - baselines[best]
        sets += 1
        ahead += lead >= BAR_MARGIN
        checks = [
            f"CBOP {cbop:.1f} vs best baseline {best} {baselines[best]:.1f} ({lead:+.1f}; "
            f"at least every baseline {'met' if lead >= 0 else 'NOT met'}; "
            f"+{BAR_MARGIN:g} {'met' if lead >= BAR_MARGIN else 'not met'})"
        ]
        runs = [s for s in summaries if s["dataset"] == dataset and s["variant"] == "cbop"]
        shares = [
            r["final_normalized_score"] / r["best_normalized_score"]
            for r in runs
            if r["best_normalized_score"] > 0
        ]
        if not shares:  # no per-seed summaries: the means
            own_best = by_variant["cbop"]["best_mean"]
            shares = [cbop / own_best] if own_best > 0 else []
        if shares:
            kept = min(shares)
            checks.append(
                f"keeps at least {kept:.2f} of its best on every seed "
                f"({'met' if kept >= BAR_KEEP else 'NOT met'} >= {BAR_KEEP:g})"
            )
        gaps = [
            (r.get("analysis") or {}).get("conservatism", {}).get("overestimation") for r in runs
        ]
        if gaps and all(gap is not None for gap in gaps):
            checks.append(
                f"Q - MC at the end at most {max(gaps):+.1f} "
                f"({'met' if max(gaps) < 0 else 'NOT met'} < 0 on every seed)"
            )
        lines.append(f"- {dataset}: " + "; ".join(checks))
    if sets:
        lines.append(
            f"- over the sets: {ahead} of {sets} at the best baseline + {BAR_MARGIN:g} "
            f"({'met' if ahead >= BAR_MARGIN_SETS else 'NOT met'} >= {BAR_MARGIN_SETS})"
        )
    return lines


PAPER_CONSERVATISM: dict[tuple[str, str], dict[str, float]] = {
    ("hopper", "medium"): {"cbop": -55.83, "cql": -61.84},
    ("hopper", "medium-replay"): {"cbop": -172.45, "cql": -142.89},
    ("hopper", "medium-expert"): {"cbop": -114.39, "cql": -79.67},
    ("halfcheetah", "medium"): {"cbop": -106.24, "cql": -222.43},
    ("halfcheetah", "medium-replay"): {"cbop": -84.42, "cql": -363.00},
    ("halfcheetah", "medium-expert"): {"cbop": -210.51, "cql": -310.95},
    ("walker2d", "medium"): {"cbop": -84.70, "cql": -167.36},
    ("walker2d", "medium-replay"): {"cbop": -80.31, "cql": -285.02},
    ("walker2d", "medium-expert"): {"cbop": -75.89, "cql": -156.71},
}
"""The paper's conservatism table (appendix, ``tab:pe-full``): mean of ``Q - MC`` at the end
of training on the D4RL v2 set of this family and kind, for CBOP and CQL."""


def paper_conservatism(dataset: str, variant: str) -> float | None:
    """The paper's mean ``Q - MC`` for the D4RL set of ``dataset``'s family and kind, or None.

    ``variant`` ``cbop*`` reads CBOP's column, ``cql*`` CQL's; generated look-alikes
    (``hopper-medium-replay-gen``) are compared with the D4RL set of the same name.
    """
    family = dataset.split("-", 1)[0]
    kind = next(
        (k for k in ("medium-replay", "medium-expert", "medium") if f"-{k}" in dataset), None
    )
    algorithm = variant.split("-", 1)[0]
    return PAPER_CONSERVATISM.get((family, kind or ""), {}).get(algorithm)


def conservatism_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 2: learned Q(s, pi(s)) at dataset states vs the real discounted MC return, per run.

    ``overestimation`` is the raw difference (the paper's quantity);
    ``overestimation_no_entropy`` removes a soft critic's entropy part (None in summaries made
    before it was measured); ``paper`` is the paper's mean for the matching D4RL set.
    """
    rows = []
    for (dataset, variant), runs in group_runs(summaries).items():
        for run in runs:
            numbers = run.get("analysis", {}).get("conservatism")
            if numbers:
                rows.append(
                    {
                        "dataset": dataset,
                        "variant": variant,
                        "seed": run["seed"],
                        "predicted_q_mean": numbers["predicted_q_mean"],
                        "predicted_q_min": numbers["predicted_q_min"],
                        "mc_return_mean": numbers["mc_return_mean"],
                        "mc_return_std": numbers["mc_return_std"],
                        "overestimation": numbers["overestimation"],
                        "overestimation_max": numbers.get("overestimation_max"),
                        "overestimation_no_entropy": numbers.get("overestimation_no_entropy"),
                        "states": numbers.get("states", numbers.get("episodes")),
                        "paper": paper_conservatism(dataset, variant),
                    }
                )
    return rows


def conservatism_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| dataset | algorithm | seed | states | predicted Q(s, pi(s)) | min over Q-members | "
        "MC discounted return | predicted - MC (mean, max) | without the entropy part | "
        "paper (D4RL set) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        no_entropy, paper = row.get("overestimation_no_entropy"), row.get("paper")
        states = "" if row["states"] is None else row["states"]
        lines.append(
            f"| {row['dataset']} | {row['variant']} | {row['seed']} | {states} | "
            f"{row['predicted_q_mean']:.1f} | {row['predicted_q_min']:.1f} | "
            f"{row['mc_return_mean']:.1f} ± {row['mc_return_std']:.1f} | "
            f"{row['overestimation']:+.1f}, {_fmt(row['overestimation_max'])} | "
            f"{_signed(no_entropy)} | {_signed(paper)} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- rliable
def rliable_aggregates(
    summaries: Sequence[dict[str, Any]], reps: int = 2000
) -> dict[str, dict[str, list[float]]] | None:
    """IQM, optimality gap (to 100) and P(variant > others) with bootstrap 95% CIs.

    Scores are final normalized scores on the 0-100 scale of every other figure, a
    ``[runs, datasets]``
    matrix per variant that has runs on every dataset (its lowest seeds, as many on
    each dataset as it has on its least-run one; ``runs`` says how many);
    P(cbop > other) only where the two matrices have the same shape. Returns None
    when ``rliable`` is not installed.
    """
    try:
        import numpy as np
        from rliable import library as rly
        from rliable import metrics
    except ImportError:
        return None
    datasets = sorted({s["dataset"] for s in summaries})
    by_variant: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in sorted(summaries, key=lambda s: s["seed"]):
        by_variant[s["variant"]][s["dataset"]].append(protocol_final(s))
    matrices = {}
    for variant, per_dataset in by_variant.items():
        runs = min(len(per_dataset.get(d, [])) for d in datasets)
        if runs:  # on every dataset: its lowest seeds, as many on each
            matrices[variant] = np.array([per_dataset[d][:runs] for d in datasets]).T
    if not matrices:
        return {}

    def aggregate(x):
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_optimality_gap(x, 100.0)])

    points, intervals = rly.get_interval_estimates(matrices, aggregate, reps=reps)
    out: dict[str, dict[str, list[float]]] = {}
    for variant in sorted(matrices, key=variant_order):
        out[variant] = {
            "runs": [float(matrices[variant].shape[0])],
            "iqm": [float(points[variant][0]), *map(float, intervals[variant][:, 0])],
            "optimality_gap": [float(points[variant][1]), *map(float, intervals[variant][:, 1])],
        }
    if "cbop" in matrices:
        pairs = {
            f"cbop,{other}": (matrices["cbop"], matrices[other])
            for other in matrices
            if other != "cbop" and matrices[other].shape == matrices["cbop"].shape
        }
        if pairs:
            prob, prob_ci = rly.get_interval_estimates(
                pairs, metrics.probability_of_improvement, reps=reps
            )
            for pair in pairs:
                out.setdefault("probability_of_improvement", {})[pair] = [
                    float(prob[pair]),
                    *map(float, prob_ci[pair][:, 0]),
                ]
    return out


def rliable_markdown(aggregates: dict[str, dict[str, list[float]]]) -> str:
    lines = [
        "Scores are final normalized scores (0-100) pooled over datasets and seeds; "
        "each in brackets: its 95% stratified bootstrap interval.",
        "",
        "| algorithm | runs per dataset | IQM [95% interval] | "
        "optimality gap to 100 [95% interval] |",
        "|---|---|---|---|",
    ]
    for variant, values in aggregates.items():
        if variant == "probability_of_improvement":
            continue
        iqm, gap = values["iqm"], values["optimality_gap"]
        runs = int(values.get("runs", [0])[0])
        lines.append(
            f"| {variant} | {runs} | {iqm[0]:.1f} [{iqm[1]:.1f}, {iqm[2]:.1f}] | "
            f"{gap[0]:.1f} [{gap[1]:.1f}, {gap[2]:.1f}] |"
        )
    improvement = aggregates.get("probability_of_improvement", {})
    if improvement:
        lines += ["", "| P(X > Y) | estimate [95% interval] |", "|---|---|"]
        for pair, (point, low, high) in improvement.items():
            x, y = pair.split(",")
            lines.append(f"| P({x} > {y}) | {point:.2f} [{low:.2f}, {high:.2f}] |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- report
LONG_FIGURE_TITLE = f"{{dataset}}: the {LONG_STEPS:,}-step protocol"
EARLIER_FIGURE_TITLE = f"{{dataset}}: the earlier protocol ({EARLIER_STEPS:,} CBOP steps)"
"""A results folder's curve figures' titles, each naming its protocol."""


def _headline_curves(
    summaries: Sequence[dict[str, Any]],
    out_dir: Path,
    headline: Mapping[str, Mapping[str, str]] | None,
    long_headline: Mapping[str, Mapping[str, str]] | None,
) -> list[Path]:
    """The headline's curves (:func:`write_report`): a results folder's 50,000-step rows in
    ``curves_<dataset>.png`` and its earlier protocol's in ``curves_20k_<dataset>.png``;
    otherwise ``headline``'s rows in ``curves_<dataset>.png``."""
    if not long_headline:
        return plot_learning_curves(summaries, out_dir, headline=headline)
    figures = plot_learning_curves(
        summaries, out_dir, headline=long_headline, title=LONG_FIGURE_TITLE
    )
    return figures + plot_learning_curves(
        summaries,
        out_dir,
        headline=headline,
        name="curves_20k_{dataset}.png",
        title=EARLIER_FIGURE_TITLE,
    )


def _results_section(
    summaries: Sequence[dict[str, Any]],
    table: str,
    headline: Mapping[str, Mapping[str, str]] | None,
    long_headline: Mapping[str, Mapping[str, str]] | None,
) -> tuple[str, list[str]]:
    """``headline.md``'s text and the opening of ``README_results.md``'s "Results" section
    (:func:`write_report`), down to ``table`` (every variant's)."""
    headline_table = headline_markdown(summaries, headline)
    if not long_headline:
        intro = (
            f"Final normalized score (mean over seeds of each run's last {FINAL_EVALUATIONS} "
            "evaluations; in parentheses the lowest and highest seed's and the number of "
            "seeds):\n"
        )
        return headline_table, ["## Results\n", intro, headline_table, "\nEvery variant:\n", table]
    long_table = long_headline_markdown(long_finals(summaries, long_headline))
    page = headline_page(long_table, headline_table)
    every = (
        f"\nEvery variant (each run's final the mean of its last {LONG_FINAL_WINDOW} "
        f"evaluations for a 50,000-step row, else its last {EARLIER_FINAL_WINDOW}):\n"
    )
    return page, ["## Results\n", page, every, table]


def write_report(
    summaries: Sequence[dict[str, Any]],
    out_dir: str | Path,
    figure_prefix: str = "",
    headline: Mapping[str, Mapping[str, str]] | None = None,
    long_headline: Mapping[str, Mapping[str, str]] | None = None,
    rliable_reps: int = 2000,
) -> dict[str, Any]:
    """Writes every table and figure into ``out_dir``; returns ``{"files": [...], ...}``.

    Args:
        summaries: from :func:`load_summaries`.
        out_dir: created if needed.
        headline: dataset -> algorithm -> its row, for ``headline.md`` and
            ``curves_<dataset>.png`` alike (:func:`headline_markdown`; for a benchmark
            results folder :func:`~cbop_torchrl.evaluation.headline.headlines_in`).
        long_headline: a benchmark results folder's 50,000-step rows, dataset -> algorithm
            -> its row (:func:`~cbop_torchrl.evaluation.headline.long_headlines_in`); given
            (not empty), they are ``headline.md``'s first table and ``curves_<dataset>.png``,
            and ``headline``'s rows the earlier protocol's table below and
            ``curves_20k_<dataset>.png``.
        figure_prefix: path prefix of the figures in ``README_results.md`` (the
            report directory as seen from the file that shows them); a prefix naming
            ``out_dir`` itself is dropped, so the file's links work where it sits.
        rliable_reps: bootstrap resamples behind the rliable intervals
            (:func:`rliable_aggregates`).
    """
    out_dir = Path(out_dir)
    if figure_prefix and Path(figure_prefix).resolve() == out_dir.resolve():
        figure_prefix = ""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = score_rows(summaries)
    files: list[Path] = []
    table = markdown_table(rows)
    _write_text(out_dir / "results.md", table)
    files += [out_dir / "results.md", _write_csv(out_dir / "results.csv", rows)]
    runs = [
        {k: s.get(k) for k in ("dataset", "variant", "seed", "gradient_steps", "wall_time_s")}
        | {
            "final_normalized_score": s["final_normalized_score"],
            "best_normalized_score": s["best_normalized_score"],
            "best_step": s.get("best_step"),
            "expected_horizon_end": s.get("diagnostics", {}).get("expected_horizon_end"),
            "commit": s.get("commit"),
        }
        for variant_runs in group_runs(summaries).values()
        for s in variant_runs
    ]
    files.append(_write_csv(out_dir / "runs.csv", runs))
    figures = _headline_curves(summaries, out_dir, headline, long_headline)
    figures += plot_learning_curves(summaries, out_dir, current_only=False)
    figures += plot_expected_horizon(summaries, out_dir)
    figures += plot_target_diagnostics(summaries, out_dir)
    figures += plot_rh_histograms(summaries, out_dir)
    figures += plot_share_histograms(summaries, out_dir)
    conservatism = conservatism_rows(summaries)
    headline_table, sections = _results_section(summaries, table, headline, long_headline)
    _write_text(out_dir / "headline.md", headline_table)
    files.append(out_dir / "headline.md")
    goals = goal_check(rows, summaries)
    if goals:
        sections += [
            f"\nGoal (final score = mean of the last {FINAL_EVALUATIONS} evaluations, mean over "
            "seeds):\n",
            "\n".join(goals) + "\n",
        ]
    datasets = dataset_markdown(summaries)
    if datasets:
        sections += ["\n### Datasets\n", datasets]
    if conservatism:
        _write_text(out_dir / "conservatism.md", conservatism_markdown(conservatism))
        files += [out_dir / "conservatism.md"]
        files.append(_write_csv(out_dir / "conservatism.csv", conservatism))
        sections += ["\n### Conservatism (paper Table 2)\n", conservatism_markdown(conservatism)]
    aggregates = rliable_aggregates(summaries, reps=rliable_reps)
    if aggregates:
        _write_text(out_dir / "rliable.md", rliable_markdown(aggregates))
        files.append(out_dir / "rliable.md")
        _write_text(out_dir / "rliable.json", json.dumps(aggregates, indent=1))
        files.append(out_dir / "rliable.json")
        plot = plot_rliable(aggregates, out_dir)
        if plot is not None:
            figures.append(plot)
        sections += ["\n### Aggregate metrics (rliable)\n", rliable_markdown(aggregates)]
    files += figures
    sections.append("\n### Figures\n")
    sections += [f"![{p.stem}]({figure_prefix}{p.name})\n" for p in figures]
    _write_text(out_dir / "README_results.md", "\n".join(sections))
    files.append(out_dir / "README_results.md")
    return {"files": files, "rows": rows, "rliable": aggregates, "conservatism": conservatism}


__all__ = [
    "conservatism_markdown",
    "conservatism_rows",
    "dataset_markdown",
    "file_versions",
    "goal_check",
    "headline_markdown",
    "markdown_table",
    "paper_conservatism",
    "rliable_aggregates",
    "rliable_markdown",
    "score_rows",
    "write_report",
]
