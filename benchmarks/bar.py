"""The results bar on CPU, checked from the benchmark's committed summaries.

    python benchmarks/bar.py                       # the 50,000-step bar (benchmarks/bar_long.py)
    python benchmarks/bar.py --protocol 20k        # the earlier 20,000-step bar, as below
    python benchmarks/bar.py --protocol 20k --cbop cbop-psi2  # one psi grid row on every set
    python benchmarks/bar.py --cbop cbop-m10       # another CBOP row (a --label's variant)
    python benchmarks/bar.py --cbop cbop-psi2 hopper-medium-replay-gen=cbop-psi3  # a set's own
    python benchmarks/bar.py --measure starts      # one measure
    python benchmarks/bar.py --every-row           # every CBOP row of each set, one line each

The bar of the 50,000-step protocol is :mod:`benchmarks.bar_long`'s. The earlier bar
(``--protocol 20k``; docs/learning.md, "Against the bar"): on the three D4RL-level sets, three
seeds each, the baselines trained for CBOP's total gradient steps (BC + FQE + CBOP;
benchmarks/learning.py gives them that budget), CBOP's final score is at least every baseline's
on every set and at least the best baseline's + 5 on two sets; on every seed its final is at
least 0.8 of its own best and Q is below the true return at the end
(``analysis.conservatism.overestimation`` < 0, Q - MC at 100 dataset states). Finals are the
rows of ``<results>/<set>/rows.json`` (``python benchmarks/learning.py --rows``): the mean over
seeds of each run's mean of its last 3 evaluations, on the reset measure (10 episodes from
``env.reset()``) or the start-state measure (one episode from each of 100 fixed dataset states),
on the set's current file (the one ``rows.json`` names); per-seed checks read the summaries made
on that file. The demo command's own condition (it ends above its BC start) is the README's, not
checked here.

Prints one table per measure and a verdict; exits 0 whether or not the bar holds (1 when no
``rows.json`` is found). ``--every-row`` prints instead, per measure, one line for every CBOP
row on each set's current file (every configuration tried there): its seeds, final and last-10
mean, its lead over the set's best baseline, the lowest seed's final / best, the highest seed's
Q - MC and the set's conditions it fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/bar.py` puts benchmarks/, not the root

from benchmarks import bar_long  # noqa: E402
from benchmarks.cbop_row import (  # noqa: E402
    SETS,
    Check,
    conservatism_check,
    current_file,
    find_row,
    headline_row,
    load_rows,
    seed_summaries,
)
from cbop_torchrl.evaluation.protocol import EARLIER_SEEDS  # noqa: E402
from cbop_torchrl.evaluation.summaries import (  # noqa: E402
    BAR_KEEP,
    BAR_MARGIN,
    BAR_MARGIN_SETS,
    BASELINES,
)

SEEDS = EARLIER_SEEDS
MARGIN = BAR_MARGIN  # above the best baseline, on MARGIN_SETS of the sets
MARGIN_SETS = BAR_MARGIN_SETS
KEEP = BAR_KEEP  # final >= KEEP * best, every seed


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
    checks.append(conservatism_check(dataset, gaps))
    return checks, lead


SELECTED = "selected"
"""``--cbop`` for each set's headline row (:func:`benchmarks.cbop_row.headline_row`): the
offline choice of psi (``<set>/psi_selection.json``), else the grid's row at the D4RL table's
psi."""


def cbop_rows(items: list[str], results: Path) -> dict[str, str]:
    """Each set's CBOP row from ``--cbop``: ``ROW`` for every set, ``SET=ROW`` for one set.

    ``selected`` (:data:`SELECTED`) names each set's headline row, read from ``results``.
    Raises ``ValueError`` (the message names what is wrong) for an unknown set or a second
    ``ROW`` for every set.
    """
    every = [item for item in items if "=" not in item]
    if len(every) > 1:
        raise ValueError(
            f"--cbop names {len(every)} rows for every set ({', '.join(every)}); give one"
        )
    own = {}
    for item in items:
        if "=" in item:
            dataset, row = item.split("=", 1)
            if dataset not in SETS or not row:
                raise ValueError(
                    f"--cbop {item}: expected SET=ROW with SET one of {', '.join(SETS)} "
                    f"and ROW a CBOP row (a variant such as cbop-psi3)"
                )
            own[dataset] = row
    rows = dict.fromkeys(SETS, every[0] if every else SELECTED) | own
    for dataset, row in rows.items():
        if row == SELECTED:
            rows[dataset] = headline_row(results, dataset)
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
        f"(default {SELECTED}: each set's offline choice of psi, psi_selection.json, else its "
        "psi grid row at the D4RL table's psi)",
    )
    parser.add_argument(
        "--protocol",
        choices=("50k", "20k"),
        default="50k",
        help="50k: the 50,000-step bar on the -50k rows (benchmarks/bar_long.py); 20k: the "
        "earlier bar on each set's headline row (--cbop and --every-row apply to it only)",
    )
    parser.add_argument("--measure", choices=("reset", "starts", "both"), default="both")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--every-row",
        action="store_true",
        help="one line for every CBOP row of each set instead of the bar for one row",
    )
    args = parser.parse_args(argv)
    if args.protocol == "50k" and args.cbop != [SELECTED]:
        parser.exit(
            2,
            f"bar: --cbop {' '.join(args.cbop)} applies to the earlier bar only: the 50,000-step "
            f"bar checks {bar_long.CBOP_ROW}; add --protocol 20k to check another CBOP row\n",
        )
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
        if args.protocol == "50k" and not args.every_row:
            checks = bar_long.check_long_bar(args.results, measure)
            print(render(checks, bar_long.CBOP_ROW, measure))
        elif args.every_row:
            print(every_row(args.results, measure))
        else:
            print(render(check_bar(args.results, cbop, measure), cbop, measure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
