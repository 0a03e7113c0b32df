"""The results bar on CPU, checked from the benchmark's committed summaries.

    python benchmarks/bar.py                       # each set's offline choice of psi, both measures
    python benchmarks/bar.py --cbop cbop           # the CPU preset's own row (the D4RL table's psi)
    python benchmarks/bar.py --cbop cbop-m10       # another CBOP row (a --label's variant)
    python benchmarks/bar.py --cbop cbop hopper-medium-replay-gen=cbop-starts  # one set's own row
    python benchmarks/bar.py --measure starts      # one measure
    python benchmarks/bar.py --every-row           # every CBOP row of each set, one line each

The bar (docs/learning.md, "Against the bar"): on the three D4RL-level sets, three seeds each,
the baselines trained for CBOP's total gradient steps (BC + FQE + CBOP; benchmarks/learning.py
gives them that budget), CBOP's final score is at least every baseline's on every set and at
least the best baseline's + 5 on two sets; on every seed its final is at least 0.8 of its own
best and Q is below the true return at the end (``analysis.conservatism.overestimation`` < 0,
Q - MC at 100 dataset states). Finals are the rows of ``<results>/<set>/rows.json``
(``python benchmarks/learning.py --rows``): the mean over seeds of each run's mean of its last
3 evaluations, on the reset measure (10 episodes from ``env.reset()``) or the start-state
measure (one episode from each of 100 fixed dataset states), on the set's current file (the
one ``rows.json`` names); per-seed checks read the summaries made on that file. The demo
command's own condition (it ends above its BC start) is the README's, not checked here.

Prints one table per measure and a verdict; exits 0 whether or not the bar holds (1 when no
``rows.json`` is found). ``--every-row`` prints instead, per measure, one line for every CBOP
row on each set's current file (every configuration tried there): its seeds, final and last-10
mean, its lead over the set's best baseline, the lowest seed's final / best, the highest seed's
Q - MC and the set's conditions it fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from cbop_torchrl.evaluation.summaries import BAR_KEEP, BAR_MARGIN, BAR_MARGIN_SETS, BASELINES

ROOT = Path(__file__).resolve().parents[1]
SETS = ("hopper-medium-replay-gen", "walker2d-medium-replay-gen", "halfcheetah-medium-replay-gen")
SEEDS = 3
MARGIN = BAR_MARGIN  # above the best baseline, on MARGIN_SETS of the sets
MARGIN_SETS = BAR_MARGIN_SETS
KEEP = BAR_KEEP  # final >= KEEP * best, every seed


@dataclass
class Check:
    """One condition of the bar on one set (or over the sets): whether it holds, and why."""

    where: str
    what: str
    holds: bool
    detail: str


def load_rows(results: Path, dataset: str) -> dict | None:
    path = results / dataset / "rows.json"
    return json.loads(path.read_text()) if path.is_file() else None


def current_file(rows: dict) -> str:
    """The set's current file as rows name it (``dataset_sha256``: 12 characters)."""
    return str(rows["sha256"])[:12]


def find_row(rows: dict, variant: str, measure: str) -> dict | None:
    """The variant's row on the set's current file."""
    file = current_file(rows)
    for row in rows["rows"]:
        if (row["variant"], row["measure"], row.get("dataset_sha256")) == (variant, measure, file):
            return row
    return None


def seed_summaries(results: Path, dataset: str, variant: str, file: str) -> list[dict]:
    """The variant's per-seed summaries made on the file whose sha256 begins with ``file``."""
    summaries = []
    for path in sorted((results / dataset / variant).glob("seed*.json")):
        summary = json.loads(path.read_text())
        if str(summary.get("dataset_provenance", {}).get("sha256"))[:12] == file:
            summaries.append(summary)
    return summaries


def final_and_best(summary: dict, measure: str) -> tuple[float, float]:
    """A run's final (mean of its last 3 evaluations) and best single evaluation."""
    if measure == "reset":
        return summary["final_normalized_score"], summary["best_normalized_score"]
    starts = summary["start_states"]
    return starts["final_normalized_score"], max(score for _, score in starts["curve"])


def seed_figures(
    results: Path, dataset: str, variant: str, file: str, measure: str
) -> tuple[list[float], list[float | None]]:
    """Each seed's final / best and Q - MC at the end (None where the summary has none)."""
    ratios, gaps = [], []
    for summary in seed_summaries(results, dataset, variant, file):
        final, best = final_and_best(summary, measure)
        ratios.append(final / best if best > 0 else float("nan"))
        gaps.append(summary.get("analysis", {}).get("conservatism", {}).get("overestimation"))
    return ratios, gaps


def check_set(results: Path, dataset: str, cbop: str, measure: str) -> tuple[list[Check], float]:
    """The set's checks and CBOP's lead over its best baseline (-inf when a row is missing)."""
    rows = load_rows(results, dataset)
    if rows is None:
        return [Check(dataset, "rows", False, "no rows.json")], float("-inf")
    checks = []
    cbop_row = find_row(rows, cbop, measure)
    baseline_rows = {name: find_row(rows, name, measure) for name in BASELINES}
    for name, row in {cbop: cbop_row, **baseline_rows}.items():
        seeds = len(row["seeds"]) if row else 0
        checks.append(
            Check(dataset, f"{name}: {SEEDS} seeds", seeds >= SEEDS, f"{seeds} on this measure")
        )
    present = {name: row["final"] for name, row in baseline_rows.items() if row}
    if cbop_row is None or not present:
        return checks, float("-inf")
    best_name = max(present, key=present.get)
    lead = cbop_row["final"] - present[best_name]
    checks.append(
        Check(
            dataset,
            "at least every baseline",
            lead >= 0,
            f"{cbop} {cbop_row['final']:.1f}, best baseline {best_name} "
            f"{present[best_name]:.1f} (lead {lead:+.1f})",
        )
    )
    ratios, gaps = seed_figures(results, dataset, cbop, current_file(rows), measure)
    checks.append(
        Check(
            dataset,
            f"final >= {KEEP} x best, every seed",
            bool(ratios) and all(ratio >= KEEP for ratio in ratios),
            ", ".join(f"{ratio:.2f}" for ratio in ratios) or "no summaries",
        )
    )
    checks.append(
        Check(
            dataset,
            "Q - MC < 0 at the end, every seed",
            bool(gaps) and all(gap is not None and gap < 0 for gap in gaps),
            ", ".join("n/a" if gap is None else f"{gap:+.1f}" for gap in gaps) or "no summaries",
        )
    )
    return checks, lead


SELECTED = "selected"
"""``--cbop`` for each set's offline choice of psi (``<set>/psi_selection.json``'s row,
``benchmarks/psi_grid.py --select``); ``cbop`` on a set without a selection."""


SELECTION_NAME = "psi_selection.json"
"""Each set's offline choice of psi, ``<results>/<set>/psi_selection.json``."""


def selected_row(results: Path, dataset: str) -> str | None:
    """The set's row of the psi FQE chose, or None where no choice has been made."""
    path = results / dataset / SELECTION_NAME
    variant = json.loads(path.read_text()).get("variant") if path.is_file() else None
    return None if variant is None else str(variant)  # null: the grid is not complete yet


def cbop_rows(items: list[str], results: Path | None = None) -> dict[str, str]:
    """Each set's CBOP row from ``--cbop``: ``ROW`` for every set, ``SET=ROW`` for one set.

    ``selected`` (:data:`SELECTED`) names each set's offline choice of psi, read from
    ``results``. Raises ``ValueError`` (the message names what is wrong) for an unknown set
    or a second ``ROW`` for every set.
    """
    every = [item for item in items if "=" not in item]
    if len(every) > 1:
        raise ValueError(
            f"--cbop names {len(every)} rows for every set ({', '.join(every)}); give one"
        )
    rows = dict.fromkeys(SETS, every[0] if every else SELECTED)
    for dataset, row in rows.items():
        if row == SELECTED:
            chosen = selected_row(results, dataset) if results is not None else None
            rows[dataset] = chosen or "cbop"
    for item in items:
        if "=" in item:
            dataset, row = item.split("=", 1)
            if dataset not in SETS or not row:
                raise ValueError(
                    f"--cbop {item}: expected SET=ROW with SET one of {', '.join(SETS)} "
                    f"and ROW a CBOP row (a variant such as cbop-starts)"
                )
            rows[dataset] = row
    return rows


def check_bar(results: Path, cbop: str | dict[str, str], measure: str) -> list[Check]:
    """Every condition of the bar; ``cbop`` is the CBOP row on every set, or one per set."""
    per_set = cbop if isinstance(cbop, dict) else dict.fromkeys(SETS, cbop)
    checks, leads = [], []
    for dataset in SETS:
        set_checks, lead = check_set(results, dataset, per_set[dataset], measure)
        checks += set_checks
        leads.append(lead)
    ahead = sum(lead >= MARGIN for lead in leads)
    checks.append(
        Check(
            "all sets",
            f"best baseline + {MARGIN:g} on {MARGIN_SETS} sets",
            ahead >= MARGIN_SETS,
            f"on {ahead} (leads: {', '.join(_signed(lead) for lead in leads)})",
        )
    )
    return checks


def _signed(value: float) -> str:
    return "n/a" if value == float("-inf") else f"{value:+.1f}"


def render(checks: list[Check], cbop: str | dict[str, str], measure: str) -> str:
    if isinstance(cbop, dict):
        names = set(cbop.values())
        cbop = names.pop() if len(names) == 1 else ", ".join(f"{d}={r}" for d, r in cbop.items())
    lines = [
        f"## {cbop}, {measure} measure",
        "",
        "| set | condition | holds | numbers |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c.where} | {c.what} | {'yes' if c.holds else '**no**'} | {c.detail} |" for c in checks
    ]
    failed = [c for c in checks if not c.holds]
    verdict = "holds" if not failed else f"does not hold ({len(failed)} of {len(checks)} fail)"
    return "\n".join([*lines, "", f"The bar {verdict}.", ""])


def every_row(results: Path, measure: str) -> str:
    """One line per CBOP row (a variant named ``cbop...``) on each set's current file."""
    lines = [
        f"## Every CBOP row on each set's current file, {measure} measure",
        "",
        "| set | row | seeds | final | last 10 | lead over the best baseline "
        "| final / best, lowest seed | Q - MC, highest seed | conditions it fails |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in SETS:
        rows = load_rows(results, dataset)
        if rows is None:
            continue
        file = current_file(rows)
        names = sorted(
            {
                row["variant"]
                for row in rows["rows"]
                if row["variant"].startswith("cbop")
                and row["measure"] == measure
                and row.get("dataset_sha256") == file
            }
        )
        for name in names:
            row = find_row(rows, name, measure)
            checks, lead = check_set(results, dataset, name, measure)
            ratios, gaps = seed_figures(results, dataset, name, file, measure)
            known = [gap for gap in gaps if gap is not None]
            fails = [c.what for c in checks if not c.holds]
            lines.append(
                f"| {dataset} | {name} | {', '.join(map(str, row['seeds']))} "
                f"| {row['final']:.1f} | {row['last10']:.1f} | {_signed(lead)} "
                f"| {f'{min(ratios):.2f}' if ratios else 'n/a'} "
                f"| {f'{max(known):+.1f}' if known else 'n/a'} | {'; '.join(fails) or 'none'} |"
            )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cbop",
        nargs="+",
        default=[SELECTED],
        metavar="ROW|SET=ROW",
        help="the CBOP row (variant) to check on every set, and SET=ROW for a set's own row "
        f"(default {SELECTED}: each set's offline choice of psi, psi_selection.json)",
    )
    parser.add_argument("--measure", choices=("reset", "starts", "both"), default="both")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--every-row",
        action="store_true",
        help="one line for every CBOP row of each set instead of the bar for one row",
    )
    args = parser.parse_args(argv)
    try:
        cbop = cbop_rows(args.cbop, args.results)
    except ValueError as error:
        parser.exit(2, f"bar: {error}\n")
    if not any((args.results / dataset / "rows.json").is_file() for dataset in SETS):
        print(
            f"bar: no rows.json under {args.results} for {', '.join(SETS)}; make them with "
            "python benchmarks/learning.py --rows",
            file=sys.stderr,
        )
        return 1
    measures = ("reset", "starts") if args.measure == "both" else (args.measure,)
    for measure in measures:
        if args.every_row:
            print(every_row(args.results, measure))
        else:
            print(render(check_bar(args.results, cbop, measure), cbop, measure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
