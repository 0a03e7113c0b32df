"""The results figures that appear on several pages, generated from one source.

The source is the benchmark's summaries (``benchmarks/results/<dataset>/<variant>/seed*.json``)
read with the report's functions (:mod:`cbop_torchrl.evaluation.summaries` and
:mod:`cbop_torchrl.evaluation.report`), the same ones that
write ``benchmarks/results/report/``. A page holds a generated block between

    <!-- generated: NAME (python docs/_tools/results_tables.py --write) -->
    ...
    <!-- end: NAME -->

and ``python docs/_tools/results_tables.py --write`` rewrites every block of README.md and the
docs pages from the summaries there are; ``--check`` (and tests/test_docs_results_tables.py)
fails when one differs. Blocks:

- ``headline``: each current algorithm's final score per dataset, with the lowest and highest
  seed's and the number of seeds, the data's behaviour policy and size
  (:func:`~cbop_torchrl.evaluation.report.headline_markdown`).
- ``datasets``: the sets the results were measured on, from the generator's provenance that
  each summary stores (transitions, episodes, behaviour policy, file).
- ``rows``: every row (algorithm or configuration) of every set on its current file, on both
  measures (reset and start states), with the seeds and 95% intervals of
  ``benchmarks/results/<dataset>/rows.json`` (``python benchmarks/learning.py --rows``).
- ``bar``: the one definition of the bar CBOP is held to and of the statistic every claim uses,
  made from ``benchmarks/bar.py``'s constants (:func:`bar_markdown`). ``--write`` also writes it
  to ``docs/_snippets/bar.md``, which the docs pages include (``--8<-- "bar.md"``,
  pymdownx.snippets); the README, which GitHub shows without includes, holds it as a block.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "results.md",
    ROOT / "docs" / "datasets.md",
)
SNIPPETS = ROOT / "docs" / "_snippets"
"""Generated text the docs pages include whole (pymdownx.snippets' ``base_path``)."""
BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) \(python docs/_tools/results_tables.py --write\) -->\n)"
    r"(?P<body>.*?)"
    r"(<!-- end: (?P=name) -->)",
    re.S,
)


def _bar_constants() -> dict:
    """``benchmarks/bar.py``'s sets, seeds, margin and share: the bar as it is checked."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import bar as module

    names = ("SETS", "SEEDS", "MARGIN", "MARGIN_SETS", "KEEP")
    return {name: getattr(module, name) for name in names}


def bar_markdown() -> str:
    """The bar and the statistic, in words, from the constants ``benchmarks/bar.py`` checks."""
    from cbop_torchrl.evaluation.summaries import FINAL_EVALUATIONS

    c = _bar_constants()
    sets = len(c["SETS"])
    words = {2: "two", 3: "three"}
    return (
        f"**The bar** CBOP is held to (`python benchmarks/bar.py` checks it condition by "
        f"condition, on each measure): on the {words.get(sets, sets)} `*-medium-replay-gen` "
        f"sets, {c['SEEDS']} seeds each, with the baselines trained for as many gradient steps "
        f"as CBOP's whole pipeline (BC + FQE + CBOP),\n\n"
        f"1. CBOP's final score is at least every baseline's, on every set;\n"
        f"2. it is at least the best baseline's + {c['MARGIN']:g}, on "
        f"{words.get(c['MARGIN_SETS'], c['MARGIN_SETS'])} of the sets;\n"
        f"3. on every seed, the run's final is at least {c['KEEP']:g} x its own best "
        f"evaluation (its *share of best*, on the same measure);\n"
        f"4. on every seed, Q - MC < 0 at the end: the critics' value of the policy's actions "
        f"is below the true discounted return (Monte-Carlo) from 100 dataset states.\n\n"
        f"**The statistic.** A run's *final score* is the mean of its last {FINAL_EVALUATIONS} "
        f"evaluations, normalized (0 = random, 100 = D4RL's expert), on the *reset measure* "
        f"(10 episodes from `env.reset()` every 1,000 steps); a row's final is the mean over "
        f"its seeds. The *start-state final* (one episode from each of 100 fixed dataset states "
        f"restored in the simulator, less noisy) stands beside it where it was logged. Two rows "
        f"are said to differ only where their finals differ by more than the resolution "
        f"`benchmarks/results/<set>/rows.json` gives for them: 1.96 x the root of the sum of "
        f"their squared standard errors (its `rule`; a row's `final_min_difference`).\n"
    )


def headline() -> dict[str, dict[str, str]]:
    """Each set's headline rows, ``dataset -> algorithm -> variant``
    (:func:`cbop_torchrl.evaluation.headline.headline_rows`): the rows the report's
    ``curves_<set>.png`` plots too."""
    from cbop_torchrl.evaluation.headline import headlines_in

    return headlines_in([RESULTS])


def summaries() -> list[dict]:
    """The benchmark's summaries, each set's current file the one its ``rows.json`` names (the
    repository's copy of the set), not only the file of its most recent run."""
    from cbop_torchrl.evaluation.headline import current_files_in
    from cbop_torchrl.evaluation.summaries import load_summaries

    return load_summaries([RESULTS], analysis=False, current=current_files_in([RESULTS]))


def datasets_markdown(found: list[dict], rows: dict[str, dict[str, str]]) -> str:
    """The sets of the headline (its rows' runs): size, behaviour policy, file."""
    from cbop_torchrl.evaluation.headline import headline_of
    from cbop_torchrl.evaluation.report import file_versions

    lines = [
        "| dataset | transitions | episodes | the data's mean episode score | behaviour policy "
        "(medium), normalized | file (sha256) |",
        "|---|---|---|---|---|---|",
    ]
    for dataset in sorted({s["dataset"] for s in found}):
        provenances = [
            s["dataset_provenance"]
            for s in found
            if s["dataset"] == dataset
            and s["variant"] in headline_of(rows, dataset).values()
            and s.get("dataset_provenance")
        ]
        if not provenances:
            continue
        p = provenances[0]
        lines.append(
            f"| {dataset} | {int(p['transitions']):,} | {int(p['episodes']):,} | "
            f"{float(p['episode_normalized_score_mean']):.1f} | "
            f"{float(p['policy_normalized_score']):.1f} | {file_versions(provenances)} |"
        )
    return "\n".join(lines) + "\n"


def _score(row: dict | None, key: str) -> str:
    if row is None:
        return ""
    low, high = row[f"{key}_ci95"]
    return f"{row[key]:.1f} [{low:.1f}, {high:.1f}]"


def rows_markdown(results: Path = RESULTS) -> str:
    """One table per set of its ``rows.json``: each row's final and last-10 on both measures.

    Rows made on an earlier file of the set (another sha256 than the current file's, the one
    ``rows.json`` names) are named with that file and come after the current file's rows;
    within each, the baselines first (in :data:`BASELINES` order), then CBOP's rows by name.
    An earlier file's row with the same seeds and numbers as the current file's row of its
    variant (the same runs, summarized for both files) is left out, and a line under the
    table says so.
    """
    from cbop_torchrl.evaluation.summaries import BASELINES

    def row_order(name: str) -> tuple[bool, int, str]:
        variant = name.split(" (file ")[0]
        rank = BASELINES.index(variant) if variant in BASELINES else len(BASELINES)
        return (variant != name, rank, name)

    parts = []
    for path in sorted(results.glob("*/rows.json")):
        rows = json.loads(path.read_text())
        current = str(rows["sha256"])[:12]
        by_name: dict[str, dict[str, dict]] = {}
        for row in rows["rows"]:
            file = row["dataset_sha256"]
            name = row["variant"] if file == current else f"{row['variant']} (file {file})"
            by_name.setdefault(name, {})[row["measure"]] = row
        repeated = []
        for name in list(by_name):
            variant = name.split(" (file ")[0]
            earlier = variant != name and variant in by_name
            if earlier and _same_runs(by_name[name], by_name[variant]):
                repeated.append(name)
                del by_name[name]
        order = sorted(by_name, key=row_order)
        parts += [
            f"**{rows['dataset']}** (file sha256 {current})",
            "",
            "| row | seeds | reset final [95% interval] | reset last 10 [95% interval] | "
            "start-state final [95% interval] | start-state last 10 [95% interval] |",
            "|---|---|---|---|---|---|",
        ]
        for name in order:
            measures = by_name[name]
            seeds = sorted({seed for row in measures.values() for seed in row["seeds"]})
            reset, starts = measures.get("reset"), measures.get("starts")
            parts.append(
                f"| {name} | {', '.join(map(str, seeds))} | {_score(reset, 'final')} | "
                f"{_score(reset, 'last10')} | {_score(starts, 'final')} | "
                f"{_score(starts, 'last10')} |"
            )
        if repeated:
            names = ", ".join(name.split(" (file ")[0] for name in repeated)
            files = ", ".join(sorted({name.split(" (file ")[1].rstrip(")") for name in repeated}))
            parts += [
                "",
                f"Not repeated: {names} on the earlier file {files}. Those are the same runs as "
                f"the rows above (the same seeds and scores): the runs were made on that file and "
                f"summarized again for the current one, which holds the same transitions.",
            ]
        parts.append("")
    return "\n".join(parts)


def _same_runs(earlier: dict[str, dict], current: dict[str, dict]) -> bool:
    """Whether an earlier file's row repeats the current file's (same seeds and numbers)."""
    reset_a, reset_b = earlier.get("reset"), current.get("reset")
    if reset_a is None or reset_b is None:
        return False
    keys = ("seeds", "final", "last10")
    return all(reset_a.get(k) == reset_b.get(k) for k in keys)


def blocks(found: list[dict] | None = None) -> dict[str, str]:
    from cbop_torchrl.evaluation.report import headline_markdown

    found = summaries() if found is None else found
    rows = headline()
    return {
        "headline": headline_markdown(found, rows),
        "datasets": datasets_markdown(found, rows),
        "rows": rows_markdown(),
        "bar": bar_markdown(),
    }


def render(text: str, generated: dict[str, str]) -> str:
    """``text`` with each generated block's body replaced by its current content."""

    def replace(match: re.Match) -> str:
        return f"{match[1]}\n{generated[match['name']]}\n{match[4]}"

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages' blocks")
    parser.add_argument("--check", action="store_true", help="fail when a block is stale")
    args = parser.parse_args(argv)
    generated = blocks()
    stale = []
    snippet = SNIPPETS / "bar.md"
    if not snippet.is_file() or snippet.read_text() != generated["bar"]:
        stale.append(snippet.relative_to(ROOT).as_posix())
        if args.write:
            SNIPPETS.mkdir(exist_ok=True)
            snippet.write_text(generated["bar"])
    for page in PAGES:
        text = page.read_text()
        new = render(text, generated)
        if new != text:
            stale.append(page.relative_to(ROOT).as_posix())
            if args.write:
                page.write_text(new)
    if stale and not args.write:
        command = "python docs/_tools/results_tables.py --write"
        print(f"stale generated blocks in {', '.join(stale)}: {command}")
        return 1
    print("rewrote " + ", ".join(stale) if stale else "every generated block is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
