"""The lab notebook's curves as figures: one page per logged run, one figure per experiment.

    python docs/_tools/curve_pages.py --write    # rewrite the figures and the curve pages
    python docs/_tools/curve_pages.py --check    # fail when a page or a figure is missing or stale

Sources (the numbers, never edited by hand):

- ``docs/curves/<run>.csv``: one run's evaluations and diagnostics, a row per evaluation
  (``python benchmarks/curves.py RUN_DIR --per-run`` printed them; the columns are
  explained on each page, :data:`COLUMNS`);
- ``benchmarks/results/screens/<set>/<run>.md``: the screens' tables, whose first line names
  the notebook's experiments;
- the benchmark's summaries (``benchmarks/results/<set>/<variant>/seed*.json``) for the
  experiments of :data:`SUMMARY_EXPERIMENTS`, whose runs are benchmark rows.

Writes ``docs/curves/<run>.png`` and ``docs/curves/<run>.md`` (the figure: the score, with
Q - MC beneath where it was logged; a link to the CSV; what each column is) and
``docs/learning/figures/experiment-NN.png`` (every run of the experiment, at most
:data:`MAX_SERIES` series a plot, distinct colours, legend text of 9 pt at 100 dpi, i.e.
12.5 px at the column's width).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CURVES = ROOT / "docs" / "curves"
FIGURES = ROOT / "docs" / "learning" / "figures"
SCREENS = ROOT / "benchmarks" / "results" / "screens"
RESULTS = ROOT / "benchmarks" / "results"
MAX_SERIES = 8
DPI = 100
WIDTH_IN = 7.8  # 780 px at DPI: the content column at 1280 px, shown unscaled
FONT_PT = 9.0

COLUMNS = {
    "step": "CBOP gradient step (0: the BC actor and the FQE critic, before CBOP)",
    "normalized_score": "the policy's score, 10 evaluation episodes from `env.reset()` "
    "(0 = random, 100 = D4RL's expert)",
    "average_normalized_score": "the same for the weight average of the actor "
    "(`eval.actor_average`)",
    "q_pi": "the critics' mean Q at the policy's actions, on dataset states",
    "q_data": "the critics' mean Q at the data's actions, on the same states",
    "q_pi_minus_data": "`q_pi - q_data`",
    "q_std_pi": "the spread (std) of the M critics at the policy's actions",
    "q_start": "Q at the policy's actions at the evaluation episodes' start states",
    "mc_start": "the true discounted return (Monte-Carlo) from those states",
    "q_minus_mc_visited": "Q - MC on states the policy visits: above 0, the critic over-estimates",
    "q_minus_mc_data": "Q - MC from 100 dataset states (the paper's Table 2 measure)",
    "q_minus_mc_data_no_entropy": "the same without the entropy term in Q",
    "q_uniform_minus_data": "Q at uniformly random actions minus Q at the data's actions",
    "bc_logprob": "log-likelihood of the data's actions under the policy",
    "action_distance": "distance from the policy's action to the data's",
    "model_error_policy": "the dynamics model's one-step error on the policy's real transitions",
    "model_error_data": "its one-step error on the data",
    "horizon_gap_1": "mu_1 - mu_0: the 1-step target's mean minus the model-free one's",
    "lcb_penalty": "psi x sigma: what the lower confidence bound subtracts",
    "alpha": "the SAC temperature",
}
Q_MINUS_MC = ("q_minus_mc_visited", "q_minus_mc_data")
"""The Q - MC column drawn beneath the score, the first a run logged."""

RUN_WORDS = {
    "demo-fqe-rounds5": "the paper's FQE (5 rounds), version-1 demo data",
    "cbop-fqe-rounds5": "the paper's FQE (5 rounds)",
    "cbop": "the default",
    "frozen-critic": "the actor against the frozen FQE critic",
    "horizon0": "horizon 0 (the model-free target)",
    "m50": "M = 50 critics",
    "every100": "the default, evaluated every 100 steps",
    "default-every10": "the default, evaluated every 10 steps",
    "frozen-critic-every10": "the frozen FQE critic, evaluated every 10 steps",
    "horizon0-every10": "horizon 0, evaluated every 10 steps",
    "no-entropy-every10": "no entropy term, evaluated every 10 steps",
    "cbop-20k": "the default to 20,000 steps",
    "bc10": "a behaviour-cloning term of weight 10",
    "bc2.5": "a behaviour-cloning term of weight 2.5",
    "cbop-bc10-20k": "behaviour-cloning weight 10 to 20,000 steps",
    "walker2d-cbop-20k": "walker2d, the default to 20,000 steps",
    "cbop-60k": "the default continued to 60,000 steps",
    "cbop-avg999": "a weight average of the actor (0.999)",
}
WALKER2D_AMD = ("walker2d-medium-replay-gen", "c3d99b8eb2f6")  # the file of Experiments 42-43
HALFCHEETAH_AMD = ("halfcheetah-medium-replay-gen", "025a3446b8db")  # of Experiments 42-44
LONG_PROTOCOL_ROWS = "the 50,000-step protocol's rows"
"""Variants that stand for the 50,000-step protocol's rows (``benchmarks/bar_long.py``'s CBOP
and baseline rows) and the 20,000-step row at the set's psi (``GENERATED_PSI``), drawn as
their seeds come in; resolved by :func:`summary_runs`, which imports the checkout's package."""
SUMMARY_EXPERIMENTS = {
    36: [("hopper-medium-replay-gen", None, ["bc", "td3bc", "iql", "cql", "cbop-starts"])],
    37: [("hopper-medium-replay-gen", None, ["cbop-m10", "cbop-starts", "cql"])],
    39: [("hopper-medium-replay-gen", None, ["cbop-penalty1", "cbop-starts", "cql"])],
    40: [("hopper-medium-replay-gen", None, ["cbop-starts", "cbop-m10", "cql"])],
    41: [("hopper-medium-replay-gen", None, ["cbop-ln", "cbop-starts"])],
    42: [(*WALKER2D_AMD, ["cbop-dyn15", "cbop-penalty1"]), (*HALFCHEETAH_AMD, ["cbop-penalty1"])],
    43: [
        (*WALKER2D_AMD, ["bc", "td3bc", "iql", "cql", "cbop-dyn15"]),
        (*HALFCHEETAH_AMD, ["cbop-dyn15", "cql"]),
    ],
    44: [(*HALFCHEETAH_AMD, ["bc", "td3bc", "iql", "cql", "cbop-dyn15", "cbop-penalty1"])],
    63: [
        (f"{name}-medium-replay-gen", None, LONG_PROTOCOL_ROWS)
        for name in ("hopper", "walker2d", "halfcheetah")
    ],
}
"""Experiments whose runs are benchmark rows: (set, the file they ran on, the variants or
:data:`LONG_PROTOCOL_ROWS`), drawn from the summaries; the file's first 12 sha256
characters, None: the set's current file (its ``rows.json``). The ``cbop`` rows of
Experiments 42-44 are named ``cbop-dyn15`` since the preset's dynamics cap changed."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": FONT_PT, "legend.fontsize": FONT_PT})
    return plt


def _step_ticks(ax) -> None:
    """Step ticks as "12k" once the axis passes 10,000 steps: full numbers run together there.

    Figures of shorter runs keep their plain ticks, so their files do not change.
    """
    from matplotlib.ticker import FuncFormatter

    if ax.get_xlim()[1] >= 10_000:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))


def read_table(path: Path) -> dict[str, list[float | None]]:
    """A Markdown table's columns (``| step | ... |``) as numbers (None where empty)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    columns: dict[str, list[float | None]] = {name: [] for name in header}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name, cell in zip(header, cells, strict=False):
            columns[name].append(float(cell) if cell else None)
    return columns


def read_csv(path: Path) -> dict[str, list[float | None]]:
    with path.open() as f:
        rows = list(csv.reader(f))
    header = rows[0]
    return {
        name: [float(r[i]) if r[i] else None for r in rows[1:]] for i, name in enumerate(header)
    }


def run_title(name: str) -> str:
    """``exp14-cbop-20k-seed0`` -> ``Experiment 14: the default to 20,000 steps, seed 0``."""
    match = re.fullmatch(r"exp(\d+)-(.+)-seed(\d+)", name)
    if not match:
        return name
    number, label, seed = match.groups()
    return f"Experiment {number}: {RUN_WORDS.get(label, label)}, seed {seed}"


def _series(columns: dict, key: str) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for step, value in zip(columns["step"], columns.get(key, []), strict=False):
        if step is not None and value is not None:
            steps.append(step)
            values.append(value)
    return steps, values


def _q_key(columns: dict) -> str | None:
    return next((k for k in Q_MINUS_MC if any(v is not None for v in columns.get(k, []))), None)


def draw(runs: list[tuple[str, dict]], title: str, path: Path, lower: str = "q") -> None:
    """Score (top) and, where logged, Q - MC or the start-state score (bottom) of ``runs``.

    ``runs``: (label, columns), at most :data:`MAX_SERIES`; each its own colour of tab10.
    """
    plt = _pyplot()
    import matplotlib

    assert len(runs) <= MAX_SERIES, f"{path.name}: {len(runs)} series, at most {MAX_SERIES}"
    colours = matplotlib.colormaps["tab10"].colors
    if lower == "q":
        lower_key = {label: _q_key(columns) for label, columns in runs}
    else:
        lower_key = {label: lower for label, _ in runs}
    has_lower = any(
        key and _series(columns, key)[0] for (label, columns) in runs for key in [lower_key[label]]
    )
    rows = 2 if has_lower else 1
    fig, axes = plt.subplots(
        rows, 1, figsize=(WIDTH_IN, 2.9 * rows + 0.4), sharex=True, squeeze=False
    )
    top = axes[0, 0]
    for index, (label, columns) in enumerate(runs):
        steps, values = _series(columns, "normalized_score")
        top.plot(steps, values, marker="o", ms=2.5, lw=1.4, color=colours[index], label=label)
    top.set_ylabel("normalized score\n(0-100, reset)")
    top.set_title(title, fontsize=FONT_PT + 1)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if has_lower:
        bottom = axes[1, 0]
        keys = set()
        for index, (label, columns) in enumerate(runs):
            key = lower_key[label]
            if key:
                steps, values = _series(columns, key)
                bottom.plot(steps, values, marker="o", ms=2.5, lw=1.4, color=colours[index])
                keys.add(key)
        if lower == "q":
            bottom.axhline(0.0, color="k", lw=0.8)
            where = (
                "visited states"
                if keys == {"q_minus_mc_visited"}
                else "100 dataset states"
                if keys == {"q_minus_mc_data"}
                else "visited / dataset states"
            )
            bottom.set_ylabel(f"Q - MC\n({where})")
        else:
            bottom.set_ylabel("normalized score\n(0-100, start states)")
        bottom.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("CBOP gradient step")
    _step_ticks(axes[-1, 0])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    plt.close(fig)


def csv_text(columns: dict[str, list[float | None]]) -> str:
    def cell(value: float | None) -> str:
        return "" if value is None else f"{value:g}"

    names = list(columns)
    lines = [",".join(names)]
    for i in range(len(columns["step"])):
        lines.append(",".join(cell(columns[n][i]) for n in names))
    return "\n".join(lines) + "\n"


def run_page(name: str, columns: dict) -> str:
    number = int(re.match(r"exp(\d+)", name)[1])
    q_key = _q_key(columns)
    lower = (
        f" Beneath: Q - MC ({COLUMNS[q_key].split(' (')[0].split(':')[0]}); above the black "
        "line the critics over-estimate the policy's true return."
        if q_key
        else ""
    )
    rows = "\n".join(
        f"| `{column}` | {COLUMNS.get(column, '')} |" for column in columns if column in COLUMNS
    )
    return (
        f"# {run_title(name)}\n\n"
        f"One run of [Experiment {number}](../learning/experiment-{number:02d}.md) (the command "
        f"is there). The numbers: [{name}.csv]({name}.csv), one row per evaluation.\n\n"
        f"![{run_title(name)}: the score and Q - MC at each evaluation]({name}.png)\n\n"
        f"Top: the normalized score at each evaluation.{lower}\n\n"
        f"## The CSV's columns\n\n| column | what it is |\n|---|---|\n{rows}\n"
    )


def screen_runs() -> dict[int, list[tuple[str, str, dict]]]:
    """Experiment -> (set, label, columns) of the screens' tables that name it."""
    found: dict[int, list[tuple[str, str, dict]]] = defaultdict(list)
    for path in sorted(SCREENS.glob("*/*-seed*.md")):
        first = path.read_text().splitlines()[0]
        match = re.search(r"Experiments? ([\d, and-]+)", first)
        if not match:
            continue
        numbers: set[int] = set()
        for part in re.findall(r"\d+(?:-\d+)?", match[1]):
            low, _, high = part.partition("-")
            numbers |= set(range(int(low), int(high or low) + 1))
        label = first.lstrip("# ").split(" (")[0].split(":")[0]
        for number in numbers:
            found[number].append((path.parent.name, label, read_table(path)))
    return found


def summary_runs(number: int) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(set, [(variant (n seeds), columns)]) of a benchmark experiment, mean over seeds."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import cbop_row
    from benchmarks.bar_long import BASELINE_ROWS, CBOP_ROW
    from cbop_torchrl.config.paper import GENERATED_PSI
    from cbop_torchrl.evaluation.summaries import load_summaries

    groups = []
    for dataset, file, variants in SUMMARY_EXPERIMENTS[number]:
        if variants == LONG_PROTOCOL_ROWS:
            psi_row = cbop_row.grid_variant(GENERATED_PSI[dataset])
            variants = [CBOP_ROW, *BASELINE_ROWS, psi_row]
        if file is None:
            file = cbop_row.current_file(cbop_row.load_rows(RESULTS, dataset))
        # Named as if the experiment's file were current: its runs keep their plain names.
        found = load_summaries([RESULTS / dataset], analysis=False, current={dataset: file})
        series = []
        for variant in variants:
            runs = [s for s in found if s["dataset"] == dataset and s["variant"] == variant]
            if not runs:
                continue
            columns = _mean_columns(runs)
            series.append((f"{variant} (n={len(runs)})", columns))
        if series:
            groups.append((dataset, series))
    return groups


def _mean_columns(runs: list[dict]) -> dict:
    """The mean over runs of the reset and the start-state score, at the steps all share."""
    reset = [dict((int(s), v) for s, v in run["curve"]) for run in runs]
    starts = [
        dict((int(s), v) for s, v in (run.get("start_states") or {}).get("curve", []))
        for run in runs
    ]
    steps = sorted(set.intersection(*(set(r) for r in reset)))
    have_starts = all(starts)
    start_steps = set.intersection(*(set(s) for s in starts)) if have_starts else set()
    return {
        "step": steps,
        "normalized_score": [sum(r[s] for r in reset) / len(reset) for s in steps],
        "start_normalized_score": [
            sum(x[s] for x in starts) / len(starts) if s in start_steps else None for s in steps
        ],
    }


def experiment_groups() -> dict[int, list[tuple[str, list[tuple[str, dict]]]]]:
    """Experiment -> [(set, [(label, columns)])]: every logged run of the experiment."""
    experiments: dict[int, dict[str, list[tuple[str, dict]]]] = defaultdict(dict)
    for path in sorted(CURVES.glob("exp*.csv")):
        number = int(re.match(r"exp(\d+)", path.stem)[1])
        label = re.sub(r"^exp\d+-", "", path.stem)
        experiments[number].setdefault("curves", []).append((label, read_csv(path)))
    for number, runs in screen_runs().items():
        for dataset, label, columns in runs:
            experiments[number].setdefault(dataset, []).append((label, columns))
    return {n: list(groups.items()) for n, groups in sorted(experiments.items())}


def expected_files() -> dict[Path, str | None]:
    """Every file this tool writes: a page's text, or None for a figure."""
    files: dict[Path, str | None] = {}
    for path in sorted(CURVES.glob("exp*.csv")):
        files[path.with_suffix(".md")] = run_page(path.stem, read_csv(path))
        files[path.with_suffix(".png")] = None
    for number, groups in experiment_groups().items():
        for index, (_, runs) in enumerate(groups):
            for part in range(0, len(runs), MAX_SERIES):
                files[figure_path(number, index, part // MAX_SERIES)] = None
    for number in SUMMARY_EXPERIMENTS:
        files[FIGURES / f"experiment-{number:02d}.png"] = None
    return files


def figure_path(number: int, group: int, part: int) -> Path:
    suffix = "".join(f"-{i + 1}" for i in (group, part) if i) if (group or part) else ""
    return FIGURES / f"experiment-{number:02d}{suffix}.png"


def write() -> list[Path]:
    written = []
    for path in sorted(CURVES.glob("exp*.csv")):
        columns = read_csv(path)
        path.with_suffix(".md").write_text(run_page(path.stem, columns))
        draw([("seed " + path.stem.rsplit("seed", 1)[1], columns)], run_title(path.stem),
             path.with_suffix(".png"))  # fmt: skip
        written += [path.with_suffix(".md"), path.with_suffix(".png")]
    for number, groups in experiment_groups().items():
        for index, (dataset, runs) in enumerate(groups):
            where = "" if dataset == "curves" else f", {dataset}"
            for part in range(0, len(runs), MAX_SERIES):
                target = figure_path(number, index, part // MAX_SERIES)
                draw(runs[part : part + MAX_SERIES], f"Experiment {number}{where}", target)
                written.append(target)
    for number in SUMMARY_EXPERIMENTS:
        groups = summary_runs(number)
        target = FIGURES / f"experiment-{number:02d}.png"
        _draw_summary_groups(number, groups, target)
        written.append(target)
    return written


def _draw_summary_groups(number: int, groups: list, target: Path) -> None:
    """One panel pair per set: the reset score and the start-state score, mean over seeds."""
    plt = _pyplot()
    import matplotlib

    colours = matplotlib.colormaps["tab10"].colors
    fig, axes = plt.subplots(
        2 * len(groups), 1, figsize=(WIDTH_IN, 2.6 * 2 * len(groups) + 0.4), squeeze=False
    )
    for g, (dataset, series) in enumerate(groups):
        assert len(series) <= MAX_SERIES
        top, bottom = axes[2 * g, 0], axes[2 * g + 1, 0]
        for index, (label, columns) in enumerate(series):
            steps, values = _series(columns, "normalized_score")
            top.plot(steps, values, marker="o", ms=2.5, lw=1.4, color=colours[index], label=label)
            steps, values = _series(columns, "start_normalized_score")
            bottom.plot(steps, values, marker="o", ms=2.5, lw=1.4, color=colours[index])
        top.set_title(f"Experiment {number}, {dataset} (mean over seeds)", fontsize=FONT_PT + 1)
        top.set_ylabel("normalized score\n(0-100, reset)")
        bottom.set_ylabel("normalized score\n(0-100, start states)")
        bottom.set_xlabel("gradient step")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            _step_ticks(ax)
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=DPI, format="png", metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the figures and pages")
    parser.add_argument("--check", action="store_true", help="fail when one is stale")
    args = parser.parse_args(argv)
    if args.write:
        print(f"wrote {len(write())} files")
        return 0
    stale = [
        path.relative_to(ROOT).as_posix()
        for path, text in expected_files().items()
        if not path.is_file() or (text is not None and path.read_text() != text)
    ]
    if stale:
        print(f"stale or missing: {', '.join(stale)}: python docs/_tools/curve_pages.py --write")
        return 1
    print("every curve page and figure is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
