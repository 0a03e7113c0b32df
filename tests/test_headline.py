"""The headline's rows: one rule (cbop_torchrl.evaluation.headline) for the table and the figure.

The README's and the results page's headline tables and the report's ``curves_<set>.png`` show
one row per algorithm on each set: the 50,000-step protocol's ``<algo>-50k`` rows first
(``LONG_LABEL``), then the earlier protocol's, where CBOP's row is the set's offline choice of
psi (``psi_selection.json``; the report's ``curves_20k_<set>.png``).
"""

from __future__ import annotations

import json
from pathlib import Path

from cbop_torchrl.evaluation import headline
from cbop_torchrl.evaluation.figures import figure_series, plot_learning_curves
from cbop_torchrl.evaluation.headline_tables import EARLIER_TITLE, LONG_TITLE
from cbop_torchrl.evaluation.report import headline_markdown, write_report
from cbop_torchrl.evaluation.summaries import SUMMARY_FORMAT

DATASET = "hopper-medium-replay-gen"
SHA = "a" * 64


def _summary(variant: str, seed: int, final: float, psi: float | None = None) -> dict:
    return {
        "summary_format": SUMMARY_FORMAT,
        "variant": variant,
        "dataset": DATASET,
        "seed": seed,
        "final_normalized_score": final,
        "best_normalized_score": final + 1.0,
        "gradient_steps": 10,
        "curve": [[0, final], [10, final]],
        "diagnostics": {"settings": {"psi": psi}},
        "dataset_provenance": {"sha256": SHA, "transitions": 100, "episodes": 2},
    }


def _results(tmp_path: Path) -> Path:
    """A benchmark results folder: one set, its rows.json, psi 5 chosen offline."""
    results = tmp_path / "results"
    runs = [("cbop", 2.0, 9.0), ("cbop-psi5", 5.0, 30.0), ("bc", None, 20.0)]
    runs += [("cbop-50k", 5.0, 40.0), ("bc-50k", None, 25.0)]
    for variant, psi, final in runs:
        folder = results / DATASET / variant
        folder.mkdir(parents=True)
        (folder / "seed0.json").write_text(json.dumps(_summary(variant, 0, final, psi)))
    (results / DATASET / "rows.json").write_text(json.dumps({"sha256": SHA, "rows": []}))
    selection = {"variant": "cbop-psi5", "psi": 5.0}
    (results / DATASET / headline.SELECTION_NAME).write_text(json.dumps(selection))
    return results


def test_cbops_headline_row_is_the_offline_choice_and_a_label_names_every_row(
    tmp_path: Path,
) -> None:
    results = _results(tmp_path)
    rows = headline.headline_rows(results, DATASET)
    assert rows == {"cbop": "cbop-psi5", "bc": "bc", "td3bc": "td3bc", "iql": "iql", "cql": "cql"}
    labelled = headline.headline_rows(results, DATASET, label="50k")
    assert labelled["cbop"] == "cbop-50k" and labelled["cql"] == "cql-50k"
    assert headline.headlines_in([results, tmp_path / "elsewhere"]) == {DATASET: rows}
    assert headline.current_files_in([results]) == {DATASET: SHA[:12]}


def test_the_headline_figure_plots_the_rows_of_the_headline_table(tmp_path: Path) -> None:
    from cbop_torchrl.evaluation.summaries import load_summaries

    results = _results(tmp_path)
    found = load_summaries([results], analysis=False)
    rows = headline.headlines_in([results])
    table = headline_markdown(found, rows)
    assert "| CBOP (10 steps) | **30.0** (psi 5; 1 seed) |" in table  # the chosen psi's row
    out = tmp_path / "report"
    out.mkdir()
    (figure,) = plot_learning_curves(found, out, headline=rows)
    assert figure.name == f"curves_{DATASET}.png"
    assert figure_series(figure) == ["cbop-psi5", "bc"]  # the table's rows, in its order
    # Without the headline's rows each algorithm is its own name's row: CBOP's plain row.
    plain = tmp_path / "plain"
    plain.mkdir()
    assert figure_series(plot_learning_curves(found, plain)[0]) == ["cbop", "bc"]
    # The 50,000-step protocol's rows are the headline once the label names them.
    labelled = {DATASET: headline.headline_rows(results, DATASET, label="50k")}
    assert "**40.0**" in headline_markdown(found, labelled)
    assert figure_series(plot_learning_curves(found, plain, headline=labelled)[0]) == [
        "cbop-50k",
        "bc-50k",
    ]


def test_the_report_of_a_results_folder_draws_its_headline(tmp_path: Path) -> None:
    from cbop_torchrl.apps.report import main

    results = _results(tmp_path)
    out = tmp_path / "report"
    assert main([f"paths={results}", f"out={out}", "analysis=false", "rliable_reps=100"]) == 0
    # the 50,000-step protocol's rows first, the earlier protocol's beside them
    assert figure_series(out / f"curves_{DATASET}.png") == ["cbop-50k", "bc-50k"]
    assert figure_series(out / f"curves_20k_{DATASET}.png") == ["cbop-psi5", "bc"]
    assert "(psi 5; 1 seed)" in (out / "headline.md").read_text()
    found = json.loads((results / DATASET / "bc" / "seed0.json").read_text())
    write_report(
        [found], tmp_path / "one", rliable_reps=100
    )  # a run's own report: no headline rows needed
    assert figure_series(tmp_path / "one" / f"curves_{DATASET}.png") == ["bc"]
    assert not list((tmp_path / "one").glob("curves_20k_*"))
    assert LONG_TITLE not in (tmp_path / "one" / "headline.md").read_text()


def _long_run(seed: int, scores: list[float]) -> dict:
    """A ``cbop-50k`` run evaluated every 2,500 steps; its summary's final is the last 3's."""
    summary = _summary("cbop-50k", seed, sum(scores[-3:]) / 3, psi=5.0)
    return summary | {"curve": [[2500 * i, score] for i, score in enumerate(scores)]}


def test_the_report_of_a_results_folder_heads_with_the_50k_rows_by_their_last_four(
    tmp_path: Path,
) -> None:
    """The 50k table comes first, each cell the mean over seeds of each run's mean of its last
    4 evaluations (40.0; the last 3 would give 33.3), its seed range and "n of 5 seeds"; a row
    without runs reads "not run"; the 20,000-step table follows under the earlier protocol's
    title; a run directory's report stays as it was (no 50k table)."""
    from cbop_torchrl.apps.report import main

    results = _results(tmp_path)  # cbop-50k seed 0: 40 at every evaluation
    for seed, scores in ((1, [0.0, 50.0, 10.0, 20.0, 30.0]), (2, [0.0, 90.0, 30.0, 40.0, 50.0])):
        path = results / DATASET / "cbop-50k" / f"seed{seed}.json"
        path.write_text(json.dumps(_long_run(seed, scores)))
    out = tmp_path / "report"
    assert main([f"paths={results}", f"out={out}", "analysis=false", "rliable_reps=100"]) == 0
    text = (out / "headline.md").read_text()
    lines = text.splitlines()
    assert lines[0] == LONG_TITLE and "last 4 evaluations" in LONG_TITLE
    cbop = "| CBOP (50,000 steps) | 40.0 (seeds 27.5 to 52.5; 3 of 5 seeds) |"
    assert cbop in lines  # the last 3: (40 + 20 + 40) / 3 = 33.3, seeds 20.0 to 40.0
    assert "| BC (60,000 steps) | 25.0 (1 of 5 seeds) |" in lines
    assert "| TD3+BC (60,000 steps) | not run |" in lines
    earlier = lines.index(EARLIER_TITLE)
    assert (
        lines.index(cbop) < earlier < lines.index("| CBOP (10 steps) | **30.0** (psi 5; 1 seed) |")
    )
    assert "20,000 CBOP steps, 3 seeds" in EARLIER_TITLE and "last 3 evaluations" in EARLIER_TITLE
    readme = (out / "README_results.md").read_text()
    assert readme.index("## Results") < readme.index(cbop) < readme.index(EARLIER_TITLE)
    assert readme.index(EARLIER_TITLE) < readme.index("Every variant")
    assert figure_series(out / f"curves_{DATASET}.png") == ["cbop-50k", "bc-50k"]
    assert figure_series(out / f"curves_20k_{DATASET}.png") == ["cbop-psi5", "bc"]
    # A folder of summaries without rows.json (runs of one's own) reports as before: the
    # runs' own algorithms' table and curves, the 50k runs among "every variant" only.
    run = tmp_path / "runs"
    run.mkdir()
    for variant, seed in (("bc", 0), ("cbop-50k", 1), ("cbop-50k", 2)):
        found = results / DATASET / variant / f"seed{seed}.json"
        (run / f"{variant}-{seed}.json").write_text(found.read_text())
    assert (
        main([f"paths={run}", f"out={tmp_path / 'own'}", "analysis=false", "rliable_reps=100"]) == 0
    )
    own = (tmp_path / "own" / "headline.md").read_text()
    assert own.splitlines()[2] == "| BC (10 steps) | **20.0** (1 seed) |"
    assert LONG_TITLE not in own and EARLIER_TITLE not in own and "of 5 seeds" not in own
    assert figure_series(tmp_path / "own" / f"curves_{DATASET}.png") == ["bc"]
    assert not list((tmp_path / "own").glob("curves_20k_*"))
    assert "cbop-50k" in (tmp_path / "own" / "results.md").read_text()
