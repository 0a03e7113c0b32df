"""benchmarks/psi_grid.py: the psi grid's rows, the offline choice by FQE and its file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import bar, cbop_row, psi_grid
from cbop_torchrl.evaluation import selection

SHA = "c" * 64
DATASET = bar.SETS[2]


def write_summary(
    results: Path, variant: str, seed: int, psi: float, final: float, sha: str = SHA
) -> Path:
    """A CBOP summary with its run directory (config.json only: FQE is replaced in the tests)."""
    run_dir = results.parent / "runs" / variant / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"env": DATASET, "seed": seed}))
    summary = {
        "seed": seed,
        "variant": variant,
        "finished_utc": "2026-11-27T20:00:00Z",
        "dataset_provenance": {"sha256": sha},
        "final_normalized_score": final,
        "start_states": {"final_normalized_score": final - 1},
        "diagnostics": {"settings": {"psi": psi}, "expected_horizon_end": 1.5},
        "analysis": {"conservatism": {"overestimation": -10.0 * psi}},
        "run_dir": str(run_dir),
    }
    path = results / DATASET / variant / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return run_dir


@pytest.fixture
def results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    (results / DATASET).mkdir(parents=True)
    (results / DATASET / "rows.json").write_text(json.dumps({"sha256": SHA, "rows": []}))
    for seed in range(3):
        write_summary(results, "cbop", seed, 0.5, 2.0 + seed)  # the set's default psi
    write_summary(results, "cbop-psi0.5", 0, 0.5, 9.0)  # fewer seeds than "cbop"
    write_summary(results, "cbop-psi2", 0, 2.0, 12.0)
    write_summary(results, "cbop-psi5", 0, 5.0, 8.0)
    write_summary(results, "cbop-psi3", 0, 3.0, 50.0, sha="d" * 64)  # another file: not a row
    write_summary(results, "cbop-starts", 0, 3.0, 40.0)  # the preset's row, but not psi 3's
    return results


def test_each_grid_value_takes_its_row_with_the_most_seeds_on_the_current_file(results):
    grid = psi_grid.grid_rows(results, DATASET)
    assert {psi: (variant, sorted(found)) for psi, (variant, found) in grid.items()} == {
        0.5: ("cbop", [0, 1, 2]),
        2.0: ("cbop-psi2", [0]),
        3.0: ("cbop-starts", [0]),
        5.0: ("cbop-psi5", [0]),
    }


def fake_fqe(values: dict[str, float], calls: list[Path]):
    """score_runs that returns a fixed FQE value per variant and records the runs it scored."""

    def score_runs(run_dirs, **_):
        (run_dir,) = run_dirs
        calls.append(Path(run_dir))
        variant = Path(run_dir).parent.name
        config = json.loads((Path(run_dir) / "config.json").read_text())
        settings = asdict(selection.fqe_config_for_run(config))
        return [
            selection.RunScore(
                run_dir, DATASET, DATASET, 0, {}, values[variant], None, 20, settings
            )
        ]

    return score_runs


def test_select_writes_the_offline_choice_with_both_orders(results, monkeypatch):
    fqe = {"cbop": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0, "cbop-starts": 50.0}
    calls: list[Path] = []
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, calls))
    chosen = psi_grid.select(results, DATASET, threads=None)
    stored = json.loads((results / DATASET / psi_grid.SELECTION_NAME).read_text())
    assert chosen == stored
    assert (stored["selected_psi"], stored["variant"]) == (5.0, "cbop-psi5")
    assert stored["online_best_psi"] == 3.0  # FQE's choice disagrees: it is kept, not overridden
    by_psi = {c["psi"]: c for c in stored["candidates"]}
    # psi 0.5 has seeds 0-2, the others seed 0: they are compared on seed 0
    assert stored["compared_seeds"] == [0]
    half_seed0 = json.loads((results / DATASET / "cbop" / "seed0.json").read_text())
    assert by_psi[0.5]["fqe_seeds"] == [0, 1, 2]
    assert by_psi[0.5]["final"] == pytest.approx(half_seed0["final_normalized_score"])
    assert by_psi[0.5]["final_all_seeds"] == pytest.approx(3.0)
    assert by_psi[2.0]["start_final"] == pytest.approx(11.0)
    # FQE order 5, 2, 0.5, 3 against the online order on seed 0
    online = [8.0, 12.0, half_seed0["final_normalized_score"], 40.0]
    expected = selection.spearman_rho([300.0, 150.0, 100.0, 50.0], online)
    assert stored["spearman"]["reset"] == pytest.approx(expected)
    assert len(calls) == 6  # three seeds of psi 0.5 and one run of each other value

    # A second call scores nothing again, even with the run directories gone.
    for run_dir in calls:
        (run_dir / "config.json").unlink()
    calls.clear()
    assert psi_grid.select(results, DATASET, threads=None) == stored
    assert calls == []


def test_a_row_whose_run_directory_is_gone_is_scored_through_an_identical_rerun(
    results, monkeypatch
):
    """psi 0.5's row is "cbop" (3 seeds); its seed 0 was made again as cbop-psi0.5 here."""
    rerun = results / DATASET / "cbop-psi0.5" / "seed0.json"
    cbop0 = json.loads((results / DATASET / "cbop" / "seed0.json").read_text())
    summary = json.loads(rerun.read_text())
    summary["curve"] = cbop0["curve"] = [[0, 10.0], [1000, 2.0]]
    rerun.write_text(json.dumps(summary))
    (results / DATASET / "cbop" / "seed0.json").write_text(json.dumps(cbop0))
    gone = Path(cbop0["run_dir"])
    (gone / "config.json").unlink()
    assert psi_grid.run_dir_here(results, DATASET, 0.5, 0, cbop0) == Path(summary["run_dir"])
    cbop0["curve"] = [[0, 10.0], [1000, 3.0]]  # another run: no stand-in
    assert psi_grid.run_dir_here(results, DATASET, 0.5, 0, cbop0) is None
    fqe = {"cbop": 100.0, "cbop-psi0.5": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0}
    fqe["cbop-starts"] = 50.0
    calls: list[Path] = []
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, calls))
    stored = psi_grid.select(results, DATASET, threads=None)
    assert stored["fqe_per_run"]["cbop/seed0"]["run_dir"] == summary["run_dir"]
    assert {c["psi"]: c["fqe_seeds"] for c in stored["candidates"]}[0.5] == [0, 1, 2]


def test_a_gone_run_is_stood_for_by_a_different_rerun_scored_as_itself(results, monkeypatch):
    """psi 0.5's row is "cbop"; its seed 0 is gone and cbop-psi0.5's seed 0 (the same settings,
    another curve: e.g. another rollout dtype) is here: that policy is scored, with its own
    online final beside its FQE score."""
    cbop0 = json.loads((results / DATASET / "cbop" / "seed0.json").read_text())
    cbop0["curve"] = [[0, 10.0], [1000, 2.0]]
    (results / DATASET / "cbop" / "seed0.json").write_text(json.dumps(cbop0))
    rerun = json.loads((results / DATASET / "cbop-psi0.5" / "seed0.json").read_text())
    rerun["curve"] = [[0, 10.0], [1000, 2.5]]
    (results / DATASET / "cbop-psi0.5" / "seed0.json").write_text(json.dumps(rerun))
    (Path(cbop0["run_dir"]) / "config.json").unlink()
    fqe = {"cbop": 100.0, "cbop-psi0.5": 400.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0}
    fqe["cbop-starts"] = 50.0
    calls: list[Path] = []
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, calls))
    stored = psi_grid.select(results, DATASET, threads=None)
    half = {c["psi"]: c for c in stored["candidates"]}[0.5]
    assert half["variant"] == "cbop" and half["fqe_seeds"] == [0, 1, 2]
    assert half["fqe_runs"] == {"0": "cbop-psi0.5/seed0", "1": "cbop/seed1", "2": "cbop/seed2"}
    # compared on seed 0, the one every psi has: the stand-in's score and final
    assert half["fqe_value"] == pytest.approx(400.0)
    assert half["fqe_value_all_seeds"] == pytest.approx((400.0 + 100.0 + 100.0) / 3)
    assert half["final"] == pytest.approx(9.0)
    assert half["final_all_seeds"] == pytest.approx(3.0)  # the row's own
    assert "cbop/seed0" not in stored["fqe_per_run"]


def test_no_choice_is_made_until_every_grid_value_has_a_scored_run(results, monkeypatch):
    """With psi 3 unscored (its only run is on another file), the scores are kept, nothing is
    chosen, and the bar and the headline keep the set's default row."""
    (results / DATASET / "cbop-starts" / "seed0.json").unlink()
    fqe = {"cbop": 100.0, "cbop-psi0.5": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0}
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, []))
    stored = psi_grid.select(results, DATASET, threads=None)
    assert stored["selected_psi"] is None and stored["variant"] is None
    assert stored["missing_psi"] == [3.0]
    assert {c["psi"] for c in stored["candidates"]} == {0.5, 2.0, 5.0}
    assert cbop_row.selected_row(results, DATASET) is None
    assert "no choice until psi 3 have scored runs" in psi_grid.selection_table(results, [DATASET])


def test_the_bar_checks_each_sets_offline_choice_by_default(results, monkeypatch):
    fqe = {"cbop": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0, "cbop-starts": 50.0}
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, []))
    psi_grid.select(results, DATASET, threads=None)
    rows = bar.cbop_rows([bar.SELECTED], results)
    # hopper and walker2d have no selection and no runs: the grid row at the table's psi (2)
    assert rows == {bar.SETS[0]: "cbop-psi2", bar.SETS[1]: "cbop-psi2", DATASET: "cbop-psi5"}
    assert bar.cbop_rows(["cbop"], results)[DATASET] == "cbop"


def test_without_a_choice_the_headline_is_the_grid_row_at_the_tables_psi(results):
    assert cbop_row.table_psi(DATASET) == 0.5  # halfcheetah medium-replay in the D4RL table
    assert cbop_row.headline_row(results, DATASET) == "cbop"  # psi 0.5's row with most seeds
    for seed in range(4):
        write_summary(results, "cbop-psi0.5", seed, 0.5, 9.0)
    assert cbop_row.headline_row(results, DATASET) == "cbop-psi0.5"
    assert bar.cbop_rows([bar.SELECTED], results)[DATASET] == "cbop-psi0.5"


def test_the_table_gives_every_grid_value_and_the_selection(results, monkeypatch, capsys):
    fqe = {"cbop": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0, "cbop-starts": 50.0}
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, []))
    assert psi_grid.main(["--results", str(results), "--datasets", DATASET, "--select"]) == 0
    out = capsys.readouterr().out
    assert f"| {DATASET} | 5 | cbop-psi5 | 0 | 8.0 | 7.0 | -50 | 1.50 | n/a / n/a |" in out
    assert f"| {DATASET} | 5 | cbop-psi5 | 0 | 300.0 | 8.0 | 7.0 | **FQE** |" in out
    assert "FQE chooses psi 5; the online best (reset final) is psi 3" in out


def test_an_unknown_set_is_a_clear_error(results, capsys):
    with pytest.raises(SystemExit) as exit:
        psi_grid.main(["--results", str(results), "--datasets", "nope-gen"])
    assert exit.value.code == 2
    assert "no results for nope-gen" in capsys.readouterr().err


def test_fqe_scores_are_kept_when_nothing_can_be_chosen_yet(results, monkeypatch):
    """With one grid value's run left to score, its FQE score is written with no choice, and a
    later call does not score it again."""
    runs = results.parent / "runs"
    for config in runs.glob("*/seed*/config.json"):
        if config.parent != runs / "cbop-psi2" / "seed0":
            config.unlink()
    calls: list[Path] = []
    monkeypatch.setattr(selection, "score_runs", fake_fqe({"cbop-psi2": 150.0}, calls))
    stored = psi_grid.select(results, DATASET, threads=None)
    assert calls == [runs / "cbop-psi2" / "seed0"]
    assert stored["selected_psi"] is None and stored["candidates"] == []
    assert [run["fqe_value"] for run in stored["fqe_per_run"].values()] == [150.0]
    assert json.loads((results / DATASET / psi_grid.SELECTION_NAME).read_text()) == stored
    assert "no choice (fewer than 2 grid values" in psi_grid.selection_table(results, [DATASET])
    assert cbop_row.selected_row(results, DATASET) is None

    (runs / "cbop-psi2" / "seed0" / "config.json").unlink()
    calls.clear()
    again = psi_grid.select(results, DATASET, threads=None)
    assert calls == [] and again["fqe_per_run"] == stored["fqe_per_run"]


def test_a_score_fitted_without_recorded_settings_is_fitted_again(results, monkeypatch):
    """Entries from before the FQE stage's own target rate was used name no settings: they are
    not compared, and the run is scored again while its directory is here."""
    fqe = {"cbop": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0, "cbop-starts": 50.0}
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, []))
    stored = psi_grid.select(results, DATASET, threads=None)
    assert all("fqe_settings" in entry for entry in stored["fqe_per_run"].values())
    old = stored["fqe_per_run"]["cbop-psi5/seed0"]
    stored["fqe_per_run"]["cbop-psi5/seed0"] = {
        k: (1.0 if k == "fqe_value" else v) for k, v in old.items() if k != "fqe_settings"
    }
    (results / DATASET / psi_grid.SELECTION_NAME).write_text(json.dumps(stored))
    calls: list[Path] = []
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, calls))
    assert "provisional" in psi_grid.selection_table(results, [DATASET])
    again = psi_grid.select(results, DATASET, threads=None)
    assert "provisional" not in psi_grid.selection_table(results, [DATASET])
    assert calls == [results.parent / "runs" / "cbop-psi5" / "seed0"]
    assert again["fqe_per_run"]["cbop-psi5/seed0"]["fqe_value"] == 300.0
    assert again["selected_psi"] == 5.0


def test_a_score_fitted_with_other_settings_than_todays_is_fitted_again(results, monkeypatch):
    """A stored score counts only if its settings are those FQE takes for the run now: a run
    whose config now gives another FQE target rate is fitted again; one whose directory is
    gone keeps the settings it names."""
    fqe = {"cbop": 100.0, "cbop-psi2": 150.0, "cbop-psi5": 300.0, "cbop-starts": 50.0}
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, []))
    psi_grid.select(results, DATASET, threads=None)
    psi5 = results.parent / "runs" / "cbop-psi5" / "seed0"
    config = json.loads((psi5 / "config.json").read_text())
    (psi5 / "config.json").write_text(json.dumps({**config, "fqe": {"target_tau": 0.1}}))
    assert "provisional" in psi_grid.selection_table(results, [DATASET])
    calls: list[Path] = []
    monkeypatch.setattr(selection, "score_runs", fake_fqe(fqe, calls))
    again = psi_grid.select(results, DATASET, threads=None)
    assert calls == [psi5]
    assert again["fqe_per_run"]["cbop-psi5/seed0"]["fqe_settings"]["tau"] == 0.1
    assert "provisional" not in psi_grid.selection_table(results, [DATASET])

    for run_dir in (results.parent / "runs").glob("*/seed*"):
        (run_dir / "config.json").unlink()
    calls.clear()
    kept = psi_grid.select(results, DATASET, threads=None)
    assert calls == []
    assert kept["selected_psi"] == 5.0
