"""The report's figures: learning curves, E[h], targets, the paper's histograms, rliable.

Each ``plot_*`` function draws from run summaries (:mod:`cbop_torchrl.evaluation.summaries`)
and writes PNG files atomically into ``out_dir``, returning their paths; a variant keeps one
colour across every figure of a report (:func:`variant_colours`). matplotlib is imported
when a figure is drawn, with the non-interactive Agg backend.

Made to be read on a page: a figure is at most :data:`FIGURE_WIDTH_IN` inches wide at
:data:`DPI`, so shown at the docs' column width (about 780 px) its legend and tick labels
(:data:`LEGEND_POINTS`) are at least 10 px high; a plot has at most :data:`MAX_SERIES`
series, each its own colour; every score axis is the 0-100 normalized scale.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cbop_torchrl.evaluation.headline import HEADLINE_ALGOS, headline_of
from cbop_torchrl.evaluation.summaries import (
    ALGO_NAMES,
    CURRENT,
    group_runs,
    mean_std,
    variant_order,
)
from cbop_torchrl.io import atomic_write


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


DPI = 100
FIGURE_WIDTH_IN = 7.8
"""At :data:`DPI`, 780 px: the docs' content column at 1280 px, so a figure is shown unscaled."""
LEGEND_POINTS = 9.0
"""9 pt at 100 dpi is 12.5 px: above 10 px at the column's width."""
MAX_SERIES = 8
"""The most series one plot holds; more go to further panels."""


SERIES_KEY = "cbop-torchrl series"
"""The PNG text chunk in which a learning-curve figure lists the variants it plots (a JSON
list), so a check can read what a committed figure shows (:func:`figure_series`)."""


def _save_figure(fig: Any, path: Path, series: Sequence[str] | None = None) -> Path:
    """Lays out, writes (atomically: never a half-written PNG) and closes ``fig``; ``series``,
    the variants it plots, goes into the PNG's :data:`SERIES_KEY` text chunk."""
    fig.tight_layout()
    metadata = {SERIES_KEY: json.dumps(list(series))} if series is not None else None
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png", metadata=metadata))
    _pyplot().close(fig)
    return path


def _mean_curve(runs: Sequence[dict[str, Any]], points_of) -> tuple[list, list, list]:
    """Steps present in every run, and the mean/std across runs at those steps."""
    per_run = [dict((int(s), v) for s, v in points_of(run)) for run in runs]
    steps = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    means, stds = [], []
    for step in steps:
        mean, std = mean_std([p[step] for p in per_run])
        means.append(mean)
        stds.append(std)
    return steps, means, stds


def _band(ax: Any, steps: list, mean: list, std: list, color: Any = None) -> None:
    """Shades mean +- std."""
    low = [m - s for m, s in zip(mean, std, strict=True)]
    high = [m + s for m, s in zip(mean, std, strict=True)]
    ax.fill_between(steps, low, high, alpha=0.15, color=color, linewidth=0)


def _file_name_part(variant: str) -> str:
    """``variant`` in a file name: ``cbop (file 724cd4675714)`` -> ``cbop-file-724cd4675714``."""
    return re.sub(r"[^\w.-]+", "-", variant).strip("-")


def variant_colours(variants: Iterable[str]) -> dict[str, Any]:
    """One distinct colour per variant, the same in every figure of a report.

    The current variants (:data:`CURRENT`) get the first colours of ``tab10`` in their
    order; the others follow (``tab10`` then ``tab20``'s lighter shades, then a colour
    wheel), so no two series of a figure share a colour however many there are.
    """
    import matplotlib

    ordered = sorted(set(variants), key=lambda v: (v not in CURRENT, *variant_order(v)))
    palette = list(matplotlib.colormaps["tab10"].colors)
    palette += [c for i, c in enumerate(matplotlib.colormaps["tab20"].colors) if i % 2]
    if len(ordered) > len(palette):
        wheel = matplotlib.colormaps["hsv"]
        extra = len(ordered) - len(palette)
        palette += [wheel(i / extra) for i in range(extra)]
    return {variant: palette[i] for i, variant in enumerate(ordered)}


def _legend_outside(ax: Any) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(
        fontsize=LEGEND_POINTS, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0
    )
    ax.tick_params(labelsize=LEGEND_POINTS)


def panels(variants: Sequence[str], steps: dict[str, int]) -> list[list[str]]:
    """``variants`` in groups of at most :data:`MAX_SERIES`, one plot each.

    The current variants (:data:`CURRENT`) come first; the others follow by how long they ran
    (``steps``: a variant's last step), so a run continued far beyond the others does not
    stretch every plot's x-axis: it shares a panel with the longest ones only.
    """
    current = [v for v in variants if v in CURRENT]
    others = sorted(
        (v for v in variants if v not in CURRENT), key=lambda v: (steps.get(v, 0), variant_order(v))
    )
    groups = [current[i : i + MAX_SERIES] for i in range(0, len(current), MAX_SERIES)]
    groups += [others[i : i + MAX_SERIES] for i in range(0, len(others), MAX_SERIES)]
    return [g for g in groups if g]


def plot_learning_curves(
    summaries: Sequence[dict[str, Any]],
    out_dir: Path,
    current_only: bool = True,
    headline: Mapping[str, Mapping[str, str]] | None = None,
    name: str = "curves_{dataset}.png",
    title: str = "{dataset}",
) -> list[Path]:
    """Normalized score vs gradient step per dataset, mean +- std over seeds.

    ``current_only``: the headline's rows into ``name`` (``{dataset}`` filled in; the report
    names a results folder's earlier protocol ``curves_20k_{dataset}.png``), one per algorithm
    (``headline``: dataset -> algorithm -> variant, as
    :func:`~cbop_torchrl.evaluation.report.headline_markdown` takes it; default, and for a
    set or algorithm it does not name, the algorithm's own name); else every variant into
    ``curves_all_<dataset>.png``, in panels of at most :data:`MAX_SERIES` series
    (:func:`panels`), each panel's x-axis as long as its own runs. ``title``: the plot's
    title (``{dataset}`` filled in), which can name the protocol. Each figure lists the
    variants it plots in its :data:`SERIES_KEY` text chunk (:func:`figure_series`).
    """
    plt = _pyplot()
    written = []
    groups = group_runs(summaries)
    for dataset in sorted({d for d, _ in groups}):
        rows = headline_of(headline, dataset)
        algo_of = {variant: algo for algo, variant in rows.items()}
        curves = {}
        for (d, variant), runs in groups.items():
            if d != dataset or (current_only and variant not in algo_of):
                continue
            steps, mean, std = _mean_curve(runs, lambda r: r["curve"])
            if steps:
                curves[variant] = (steps, mean, std, len(runs))
        if not curves:
            continue
        if current_only:  # one panel, the algorithms in the headline's order
            layout = [[rows[a] for a in HEADLINE_ALGOS if rows[a] in curves]]
        else:
            layout = panels(list(curves), {v: c[0][-1] for v, c in curves.items()})
        fig, axes = plt.subplots(
            len(layout), 1, figsize=(FIGURE_WIDTH_IN, 3.6 * len(layout)), squeeze=False
        )
        for ax, group in zip(axes[:, 0], layout, strict=True):
            if current_only:  # an algorithm's colour is the same on every set
                by_algo = variant_colours(HEADLINE_ALGOS)
                colours = {v: by_algo[algo_of[v]] for v in group}
            else:
                colours = variant_colours(group)  # distinct within the panel
            for variant in group:
                steps, mean, std, n = curves[variant]
                colour = colours[variant]
                label = _series_label(variant, algo_of.get(variant) if current_only else None)
                ax.plot(
                    steps, mean, marker="o", ms=2.5, lw=1.5, color=colour, label=f"{label} (n={n})"
                )
                _band(ax, steps, mean, std, colour)
            ax.set_xlabel("gradient step", fontsize=LEGEND_POINTS)
            ax.set_ylabel("normalized score (0-100)\nmean ± std over seeds", fontsize=LEGEND_POINTS)
            ax.grid(alpha=0.3)
            _legend_outside(ax)
        axes[0, 0].set_title(title.format(dataset=dataset), fontsize=10)
        file = name.format(dataset=dataset) if current_only else f"curves_all_{dataset}.png"
        series = [variant for group in layout for variant in group]
        written.append(_save_figure(fig, out_dir / file, series))
    return written


def _series_label(variant: str, algo: str | None) -> str:
    """A headline series by its algorithm's name (CBOP's with the row it is: ``CBOP
    (cbop-psi5)``); any other by its variant's."""
    if algo is None:
        return ALGO_NAMES.get(variant, variant)
    name = ALGO_NAMES.get(algo, algo)
    return name if variant == algo else f"{name} ({variant})"


def figure_series(path: str | Path) -> list[str] | None:
    """The variants a learning-curve PNG plots (its :data:`SERIES_KEY` chunk), or None where
    the figure names none (drawn before figures named their series)."""
    from PIL import Image

    with Image.open(path) as image:
        text = image.info.get(SERIES_KEY)
    return None if text is None else list(json.loads(text))


def plot_expected_horizon(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Paper Fig. 1 (right): E[h] of the CBOP posterior over training, per dataset."""
    plt = _pyplot()
    written = []
    key = "cbop/expected_horizon"
    groups = group_runs([s for s in summaries if key in s.get("train_curves", {})])
    for dataset in sorted({d for d, _ in groups}):
        curves = {
            variant: (*_mean_curve(runs, lambda r: r["train_curves"][key]), len(runs))
            for (d, variant), runs in groups.items()
            if d == dataset
        }
        curves = {v: c for v, c in curves.items() if c[0]}
        if not curves:
            continue
        layout = panels(list(curves), {v: c[0][-1] for v, c in curves.items()})
        fig, axes = plt.subplots(
            len(layout), 1, figsize=(FIGURE_WIDTH_IN, 3.4 * len(layout)), squeeze=False
        )
        for ax, group in zip(axes[:, 0], layout, strict=True):
            colours = variant_colours(group)
            for variant in group:
                steps, mean, std, n = curves[variant]
                ax.plot(steps, mean, color=colours[variant], label=f"{variant} (n={n})")
                _band(ax, steps, mean, std, colours[variant])
            ax.set_xlabel("gradient step", fontsize=LEGEND_POINTS)
            ax.set_ylabel("E[h] (posterior weights)", fontsize=LEGEND_POINTS)
            ax.grid(alpha=0.3)
            _legend_outside(ax)
        axes[0, 0].set_title(dataset, fontsize=10)
        written.append(_save_figure(fig, out_dir / f"horizon_{dataset}.png"))
    return written


def plot_target_diagnostics(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """CBOP's target scale and critic loss over training (watching for Q divergence)."""
    plt = _pyplot()
    written = []
    keys = ("cbop/target_mean", "loss_qvalue")
    groups = group_runs([s for s in summaries if keys[0] in s.get("train_curves", {})])
    colours = variant_colours(s["variant"] for s in summaries)
    for dataset in sorted({d for d, _ in groups}):
        fig, axes = plt.subplots(1, 2, figsize=(FIGURE_WIDTH_IN * 1.3, 3.5))
        for (d, variant), runs in groups.items():
            if d != dataset:
                continue
            for ax, key in zip(axes, keys, strict=True):
                if not all(key in r["train_curves"] for r in runs):
                    continue
                steps, mean, std = _mean_curve(runs, lambda r, k=key: r["train_curves"][k])
                colour = colours[variant]
                ax.plot(steps, mean, color=colour, label=f"{variant} (n={len(runs)})")
                _band(ax, steps, mean, std, colour)
        for ax, key in zip(axes, ("mean CBOP target y", "critic loss"), strict=True):
            ax.set(xlabel="gradient step")
            ax.set_title(f"{dataset}: {key}", fontsize=9)
            ax.grid(alpha=0.3)
        _legend_outside(axes[1])
        written.append(_save_figure(fig, out_dir / f"targets_{dataset}.png"))
    return written


def _first_with_analysis(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any] | None:
    for run in runs:  # sorted by seed: the lowest seed that has it
        if run.get("analysis", {}).get(key):
            return run
    return None


def plot_rh_histograms(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Paper Fig. 5: the K*M samples of R_h per h for one dataset state, with N(mu_h, std_h)."""
    plt = _pyplot()
    written = []
    for (dataset, variant), runs in group_runs(summaries).items():
        run = _first_with_analysis(runs, "rh_sample")
        if run is None:
            continue
        sample = run["analysis"]["rh_sample"]
        horizons = len(sample["returns"])
        fig, axes = plt.subplots(1, horizons, figsize=(max(2.2 * horizons, 6.5), 2.8), sharey=True)
        axes = axes if horizons > 1 else [axes]
        for h, ax in enumerate(axes):
            ax.hist(sample["returns"][h], bins=15, color="C0" if sample["valid"][h] else "C7")
            ax.set_title(f"h={h}  w={sample['weights'][h]:.2f}", fontsize=8)
            ax.tick_params(labelsize=6)
        fig.suptitle(
            f"R_h at one state: {dataset}, {variant}, seed {run['seed']} (posterior "
            f"{sample['posterior_mean']:.1f} ± {sample['posterior_std']:.1f})",
            fontsize=8,
        )
        written.append(_save_figure(fig, out_dir / f"rh_{dataset}_{_file_name_part(variant)}.png"))
    return written


def plot_share_histograms(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Paper Fig. 8: histograms over states of A/(A+B) (value share of R_h's variance) per h."""
    plt = _pyplot()
    written = []
    for (dataset, variant), runs in group_runs(summaries).items():
        run = _first_with_analysis(runs, "value_var_share")
        if run is None:
            continue
        share = run["analysis"]["value_var_share"]
        counts = share["counts"][1:]  # h = 0 has no model variance: always 1
        if not counts:
            continue
        bins = share["bins"]
        edges = [i / bins for i in range(bins + 1)]
        fig, axes = plt.subplots(
            1, len(counts), figsize=(max(2.2 * len(counts), 6.5), 2.8), sharey=True
        )
        axes = axes if len(counts) > 1 else [axes]
        for h, (ax, row) in enumerate(zip(axes, counts, strict=True), start=1):
            ax.stairs(row, edges, fill=True)
            ax.set_title(f"h={h}", fontsize=8)
            ax.set_xlabel("A/(A+B)", fontsize=7)
            ax.tick_params(labelsize=6)
        fig.suptitle(
            f"value share of Var(R_h) over {share['num_states']} states: {dataset}, "
            f"{variant}, seed {run['seed']}",
            fontsize=8,
        )
        name = f"share_{dataset}_{_file_name_part(variant)}.png"
        written.append(_save_figure(fig, out_dir / name))
    return written


def plot_rliable(aggregates: dict[str, dict[str, list[float]]], out_dir: Path) -> Path | None:
    """``rliable.png``: each variant's IQM and optimality gap with their 95% intervals."""
    variants = [v for v in aggregates if v != "probability_of_improvement"]
    if not variants:
        return None
    plt = _pyplot()
    colours = variant_colours(variants)
    labels = [
        f"{ALGO_NAMES.get(v, v)} ({int(aggregates[v].get('runs', [0])[0])} per set)"
        for v in variants
    ]
    fig, axes = plt.subplots(1, 2, figsize=(FIGURE_WIDTH_IN, 0.45 * len(variants) + 1.6))
    for ax, metric in zip(axes, ("iqm", "optimality_gap"), strict=True):
        for row, variant in enumerate(variants):
            point, low, high = aggregates[variant][metric]
            ax.plot([low, high], [row, row], color=colours[variant], lw=6, alpha=0.6)
            ax.plot([point], [row], "k|", ms=12)
        ax.set_yticks(range(len(variants)), labels if ax is axes[0] else [], fontsize=LEGEND_POINTS)
        ax.set_xlim(0, 100)  # the 0-100 normalized scale of every other figure
        ax.tick_params(labelsize=LEGEND_POINTS)
        title = "IQM" if metric == "iqm" else "optimality gap (to 100)"
        ax.set_title(f"{title}, normalized score", fontsize=LEGEND_POINTS)
        ax.grid(alpha=0.3, axis="x")
    return _save_figure(fig, out_dir / "rliable.png")


__all__ = [
    "panels",
    "plot_expected_horizon",
    "figure_series",
    "plot_learning_curves",
    "plot_rh_histograms",
    "plot_rliable",
    "plot_share_histograms",
    "plot_target_diagnostics",
    "variant_colours",
]
