"""Figures that appear on several pages come from one source and agree.

The headline results table and the datasets' sizes and behaviour policies in README.md and
docs/results.md are generated from the benchmark's summaries by docs/_tools/results_tables.py;
docs/datasets.md's table of the generated sets (from benchmarks/dataset_stats.py) must give
the same transitions and behaviour-policy score for every set the results use.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS_REPORT = ROOT / "benchmarks" / "results" / "report"
sys.path.insert(0, str(ROOT / "docs" / "_tools"))
import results_tables  # noqa: E402


@pytest.fixture(scope="module")
def summaries() -> list[dict]:
    return results_tables.summaries()


@pytest.fixture(scope="module")
def generated(summaries: list[dict]) -> dict[str, str]:
    return results_tables.blocks(summaries)


@pytest.mark.parametrize("page", results_tables.PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_generated_blocks_are_current(page: Path, generated: dict[str, str]) -> None:
    text = page.read_text()
    assert results_tables.render(text, generated) == text, (
        f"{page.name}: stale results block; run python docs/_tools/results_tables.py --write"
    )


def test_the_readme_and_the_results_page_open_with_the_headline() -> None:
    for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
        assert "<!-- generated: headline " in page.read_text(), page.name


def test_the_datasets_page_agrees_with_the_summaries(summaries: list[dict]) -> None:
    text = (ROOT / "docs" / "datasets.md").read_text()
    checked = 0
    for summary in summaries:
        provenance = summary.get("dataset_provenance")
        if not provenance or summary["variant"] != "bc":  # BC: on every set, at every preset
            continue
        rows = re.findall(rf"^\| {re.escape(summary['dataset'])} \|(.*)$", text, re.M)
        assert rows, f"docs/datasets.md has no row for {summary['dataset']}"
        cells = [c.strip() for c in rows[0].split("|")]
        transitions = int(cells[0].split()[0].replace(",", ""))
        assert transitions == int(provenance["transitions"]), (summary["dataset"], cells[0])
        behaviour = float(re.search(r", ([\d.]+) \(", cells[4])[1])  # "step, score (episodes)"
        assert behaviour == pytest.approx(provenance["policy_normalized_score"], abs=0.05)
        checked += 1
    assert checked


def test_render_replaces_only_the_named_blocks() -> None:
    text = (
        "a\n<!-- generated: headline (python docs/_tools/results_tables.py --write) -->\nold\n"
        "<!-- end: headline -->\nb\n"
    )
    new = results_tables.render(text, {"headline": "| x |\n"})
    assert new.startswith("a\n") and new.endswith("<!-- end: headline -->\nb\n")
    assert "old" not in new and "\n| x |\n" in new


def test_the_rows_table_puts_both_measures_of_a_row_side_by_side(tmp_path: Path) -> None:
    def row(variant: str, measure: str, final: float, sha: str) -> dict:
        return {
            "variant": variant,
            "measure": measure,
            "seeds": [0, 1, 2],
            "dataset_sha256": sha,
            "final": final,
            "final_ci95": [final - 1, final + 1],
            "last10": final - 2,
            "last10_ci95": [final - 3, final - 1],
        }

    rows = [
        row("cbop-x", "reset", 20.0, "a" * 12),
        row("cbop-x", "starts", 12.0, "a" * 12),
        row("cql", "reset", 18.0, "a" * 12),
        row("cbop-old", "reset", 3.0, "b" * 12),
        row("bc", "reset", 6.0, "b" * 12),
        row("bc", "reset", 7.0, "a" * 12),
    ]
    (tmp_path / "set").mkdir()
    rows_json = {"dataset": "set", "sha256": "a" * 64, "rows": rows}
    (tmp_path / "set" / "rows.json").write_text(json.dumps(rows_json))
    table = results_tables.rows_markdown(tmp_path)
    lines = table.splitlines()
    assert lines[0] == "**set** (file sha256 aaaaaaaaaaaa)"
    assert "| reset final [95% interval] |" in lines[2]  # a bracket says what it is
    assert lines[5].startswith("| cql | 0, 1, 2 | 18.0 [17.0, 19.0] | 16.0 [15.0, 17.0] |  |")
    cbop = "| cbop-x | 0, 1, 2 | 20.0 [19.0, 21.0] | 18.0 [17.0, 19.0] | 12.0 [11.0, 13.0] |"
    assert cbop in table
    assert "| cbop-old (file bbbbbbbbbbbb) |" in table
    # The current file's rows first (baselines in their order, then CBOP's), then the earlier
    # file's.
    names = [line.split(" | ")[0][2:] for line in lines[4:] if line.startswith("| ")]
    assert names == [
        "bc",
        "cql",
        "cbop-x",
        "bc (file bbbbbbbbbbbb)",
        "cbop-old (file bbbbbbbbbbbb)",
    ]


def test_an_earlier_file_row_that_repeats_the_current_one_is_left_out_and_explained(
    tmp_path: Path,
) -> None:
    def row(variant: str, sha: str) -> dict:
        scores = {"final": 10.0, "final_ci95": [9.0, 11.0], "last10": 8.0, "last10_ci95": [7, 9]}
        return {"variant": variant, "measure": "reset", "seeds": [0, 1], "dataset_sha256": sha,
                **scores}  # fmt: skip

    (tmp_path / "set").mkdir()
    both = [row("bc", "a" * 12), row("bc", "b" * 12)]
    rows = {"dataset": "set", "sha256": "a" * 64, "rows": both}
    (tmp_path / "set" / "rows.json").write_text(json.dumps(rows))
    table = results_tables.rows_markdown(tmp_path)
    assert "| bc (file bbbbbbbbbbbb) |" not in table
    assert "Not repeated: bc on the earlier file bbbbbbbbbbbb" in table


def test_the_bar_is_defined_once_and_every_page_includes_that_definition() -> None:
    bar = results_tables.bar_markdown()
    assert "at least its own BC start" in bar and "best baseline's + 5" in bar
    assert "Q - MC < 0" in bar and "Welch's df" in bar and "last 4 evaluations" in bar
    assert (ROOT / "docs" / "_snippets" / "bar.md").read_text() == bar
    assert "<!-- generated: bar " in (ROOT / "README.md").read_text()
    include = '--8<-- "bar.md"'
    assert include in (ROOT / "docs" / "results.md").read_text()
    assert include in (ROOT / "docs" / "learning.md").read_text()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:  # the bar's old wording, and the bar written out again by hand
        text = page.read_text()
        assert "10 above the behaviour policy" not in text, page
        if page.parent.name != "_snippets":
            count = text.count("at least its own BC start")
            assert count <= (1 if page.name == "README.md" else 0), page


@pytest.mark.parametrize(
    ("block", "figure_name"),
    [("headline-50k", "curves_{dataset}.png"), ("headline", "curves_20k_{dataset}.png")],
)
def test_every_headline_figure_plots_every_row_of_its_table(
    generated: dict[str, str], block: str, figure_name: str
) -> None:
    """Each protocol's figure (README.md and the results page show it beside its table):
    ``curves_<set>.png`` the 50,000-step table's rows, ``curves_20k_<set>.png`` the earlier
    protocol's; each plots every algorithm its table has a score for on that set, as the
    same row."""
    from cbop_torchrl.evaluation.figures import figure_series
    from cbop_torchrl.evaluation.headline import headline_of, long_headlines_in
    from cbop_torchrl.evaluation.summaries import ALGO_NAMES

    lines = [line for line in generated[block].splitlines() if line.startswith("| ")]
    datasets = [cell.strip() for cell in lines[0].split("|")[2:-1]]
    algo_of = {name: algo for algo, name in ALGO_NAMES.items()}
    long = block == "headline-50k"
    rows = long_headlines_in([results_tables.RESULTS]) if long else results_tables.headline()
    checked = 0
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        algo = algo_of.get(cells[0].split(" (")[0])
        if algo is None:  # the behaviour policy's and the data's lines
            continue
        for dataset, cell in zip(datasets, cells[1:], strict=True):
            if cell == "not run":
                continue
            figure = RESULTS_REPORT / figure_name.format(dataset=dataset)
            series = figure_series(figure)
            variant = headline_of(rows, dataset)[algo]
            assert series is not None and variant in series, (
                f"{figure.name} lacks {variant}, the table's {cells[0]} row: "
                "python scripts/report.py paths=benchmarks/results out=benchmarks/results/report"
            )
            checked += 1
    # the earlier table: CBOP and at least one baseline on every set; the 50k one's rows are
    # being made (CBOP on hopper so far)
    assert checked >= (1 if long else len(datasets) * 2)


def test_the_reports_headline_is_the_pages_headline(generated: dict[str, str]) -> None:
    """The report's headline.md is the pages' two tables, the 50,000-step one first: the same
    finals from the summaries (the report) as from rows.json (the pages)."""
    from cbop_torchrl.evaluation.headline_tables import headline_page

    expected = headline_page(generated["headline-50k"], generated["headline"])
    assert (RESULTS_REPORT / "headline.md").read_text() == expected, (
        "benchmarks/results/report is stale: "
        "python scripts/report.py paths=benchmarks/results out=benchmarks/results/report"
    )


@pytest.mark.parametrize("name", ["status", "status-site"])
def test_the_status_is_four_short_bullets(generated: dict[str, str], name: str) -> None:
    bullets = [line for line in generated[name].splitlines() if line.strip()]
    assert 0 < len(bullets) <= results_tables.STATUS_BULLETS, bullets
    for bullet in bullets:
        assert bullet.startswith("- "), bullet
        assert results_tables.words(bullet) <= results_tables.STATUS_WORDS, bullet
    labels = ("**Faithful to the paper:**", "**Shown**", "**Not shown:**", "**On which data:**")
    assert [b.split(" ", 1)[1].startswith(labels[i]) for i, b in enumerate(bullets)] == [True] * 4


def test_the_readmes_first_screen_holds_the_status_and_the_headline() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    tool = "(python docs/_tools/results_tables.py --write) -->"
    names = ("first-run", "status", "headline-50k", "headline")
    where = {name: lines.index(f"<!-- generated: {name} {tool}") for name in names}
    assert where["first-run"] < where["status"] < where["headline-50k"] < 50, where
    assert where["headline-50k"] < where["headline"], where  # the earlier protocol below
    assert "<!-- generated: status-site " in (ROOT / "docs" / "index.md").read_text()


def test_every_line_the_first_run_prints_is_explained() -> None:
    record = json.loads(results_tables.FIRST_RUN.read_text())
    table = results_tables.first_run_output_markdown(record)
    assert table.count("\n| ") - 1 == len(record["stdout"])  # the header, then one per line
    assert "17 min 47 s" in results_tables.first_run_markdown(record)
    assert record["cpu"] in results_tables.first_run_markdown(record)


def test_the_earlier_rows_are_on_their_page_only(generated: dict[str, str]) -> None:
    names = [line.split(" | ")[0] for line in generated["rows"].splitlines() if line[:2] == "| "]
    assert names and not [name for name in names if "-dyn15" in name or " (file " in name]
    assert "-dyn15" in generated["rows-earlier"]
    assert "<!-- generated: rows-earlier " in (ROOT / "docs" / "earlier.md").read_text()


def test_the_cbop_page_names_each_hyperparameters_key_and_both_presets(
    generated: dict[str, str],
) -> None:
    table = generated["hyperparameters"].splitlines()
    assert table[0].startswith("| key | what it sets | the paper")
    keys = [line.split("|")[1].strip().strip("`") for line in table[2:]]
    assert keys == [key for key, _ in results_tables.HYPERPARAMETERS]
    horizon = next(line for line in table if line.startswith("| `estimator.horizon`"))
    assert horizon.endswith("| null: 10 | 5 |")  # the paper's H, the CPU preset's
    assert (
        "learning.py --datasets hopper-medium-replay-gen --algos cbop-psi5"
        in (generated["reproduce"])
    )


def test_the_hyperparameters_table_does_not_follow_the_psi_dicts_order(
    generated: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that deletes and restores a GENERATED_PSI entry moves it to the dict's end; the
    table keeps the benchmark's set order."""
    from cbop_torchrl.config.paper import GENERATED_PSI

    reordered = dict(reversed(list(GENERATED_PSI.items())))
    monkeypatch.setattr("cbop_torchrl.config.paper.GENERATED_PSI", reordered)
    assert results_tables.hyperparameters_markdown() == generated["hyperparameters"]


def test_the_50k_headline_gives_each_long_row_its_final_and_seeds(tmp_path: Path) -> None:
    from cbop_torchrl.evaluation.headline import SETS

    sha = "d" * 64
    row = {
        "variant": "cbop-50k",
        "measure": "reset",
        "dataset_sha256": sha[:12],
        "seeds": [0, 1],
        "final": 11.0,
        "final_per_seed": [10.0, 12.0],
    }
    other = {**row, "variant": "cbop-psi5", "final": 99.0}  # not a 50k row: never shown
    (tmp_path / SETS[0]).mkdir()
    (tmp_path / SETS[0] / "rows.json").write_text(json.dumps({"sha256": sha, "rows": [row, other]}))
    table = results_tables.long_headline_markdown(tmp_path).splitlines()
    assert table[0] == "| algorithm | " + " | ".join(SETS) + " |"
    cell = "11.0 (seeds 10.0 to 12.0; 2 of 5 seeds)"
    assert table[2] == f"| CBOP (50,000 steps) | {cell} | not run | not run |"
    assert table[3].startswith("| BC (60,000 steps) | not run |")
    assert "99.0" not in "\n".join(table)


def _long_row(variant: str, finals: list[float], sha: str) -> dict:
    return {
        "variant": variant,
        "measure": "reset",
        "dataset_sha256": sha[:12],
        "seeds": list(range(len(finals))),
        "final": sum(finals) / len(finals),
        "final_per_seed": finals,
    }


@pytest.mark.parametrize(("seeds", "expected"), [(5, ["above BC on hopper (30.0 against 10.0)"]),
                                                 (4, [])])  # fmt: skip
def test_the_status_names_only_50k_comparisons_with_every_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeds: int, expected: list[str]
) -> None:
    from cbop_torchrl.evaluation.headline import SETS
    from cbop_torchrl.evaluation.summaries import ALGO_NAMES, BASELINES

    sha = "e" * 64
    cbop = _long_row("cbop-50k", [28.0, 29.0, 30.0, 31.0, 32.0][:seeds], sha)
    bc = _long_row("bc-50k", [9.0, 9.5, 10.0, 10.5, 11.0][:seeds], sha)
    cbop["final"], bc["final"] = 30.0, 10.0
    (tmp_path / SETS[0]).mkdir()
    (tmp_path / SETS[0] / "rows.json").write_text(json.dumps({"sha256": sha, "rows": [cbop, bc]}))
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path)
    assert results_tables._long_comparisons(SETS, BASELINES, ALGO_NAMES) == expected


def test_the_not_shown_bullet_keeps_only_the_comparisons_that_fit() -> None:
    head = "**Not shown:** the bar: 14 of 22 conditions fail; 15 of 75 runs made"
    clauses = [f"above BC on set{i} (30.0 against 10.0)" for i in range(5)]
    bullet = results_tables._within_words(head, "; so far, CBOP ", clauses)
    assert results_tables.words(bullet) <= results_tables.STATUS_WORDS
    assert "set0" in bullet and "set4" not in bullet and bullet.endswith(").")
    assert results_tables._within_words(head, "; so far, CBOP ", []) == head + "."
