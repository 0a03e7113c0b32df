"""The headline's rows: one rule (cbop_torchrl.evaluation.headline) for the table and the figure.

The README's and the results page's headline table and the report's ``curves_<set>.png`` show
one row per algorithm on each set; for CBOP that is the set's offline choice of psi
(``psi_selection.json``), and a protocol's label (``HEADLINE_LABEL``) makes every algorithm's
``<algo>-<label>`` row the headline.
"""

from __future__ import annotations

import json
from pathlib import Path

from cbop_torchrl.evaluation import headline
from cbop_torchrl.evaluation.figures import figure_series, plot_learning_curves
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
    assert main([f"paths={results}", f"out={out}", "analysis=false"]) == 0
    assert figure_series(out / f"curves_{DATASET}.png") == ["cbop-psi5", "bc"]
    assert "(psi 5; 1 seed)" in (out / "headline.md").read_text()
    found = json.loads((results / DATASET / "bc" / "seed0.json").read_text())
    write_report([found], tmp_path / "one")  # a run's own report: no headline rows needed
    assert figure_series(tmp_path / "one" / f"curves_{DATASET}.png") == ["bc"]
