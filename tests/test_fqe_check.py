"""benchmarks/fqe_check.py: stored FQE scores beside the policies' measured values."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tensordict import TensorDict

from benchmarks import cbop_row, fqe_check

SHA = "e" * 64
DATASET = cbop_row.SETS[0]


def write_run(results: Path, psi: float, seed: int, final: float, fqe: float) -> tuple[str, dict]:
    """A grid summary, its run directory (config.json only) and its stored FQE entry."""
    variant = cbop_row.grid_variant(psi)
    run_dir = results.parent / "runs" / variant / f"seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    summary = {
        "seed": seed,
        "variant": variant,
        "dataset_provenance": {"sha256": SHA},
        "final_normalized_score": final,
        "diagnostics": {"settings": {"psi": psi}},
    }
    path = results / DATASET / variant / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return f"{variant}/seed{seed}", {"fqe_value": fqe, "run_dir": str(run_dir)}


def test_each_stored_score_is_set_beside_the_measured_value_and_ranked(tmp_path, monkeypatch):
    results = tmp_path / "results"
    (results / DATASET).mkdir(parents=True)
    (results / DATASET / "rows.json").write_text(json.dumps({"sha256": SHA, "rows": []}))
    # FQE ranks psi 5 first; the measured values and the online finals rank psi 2 first.
    stored = dict(
        [
            write_run(results, 2.0, 0, final=25.0, fqe=120.0),
            write_run(results, 2.0, 1, final=21.0, fqe=130.0),
            write_run(results, 5.0, 0, final=19.0, fqe=180.0),
            write_run(results, 3.0, 0, final=22.0, fqe=170.0),
        ]
    )
    del stored["cbop-psi3/seed0"]  # not scored: left out
    selection = {"fqe_per_run": stored}
    (results / DATASET / cbop_row.SELECTION_NAME).write_text(json.dumps(selection))
    measured = {"cbop-psi2": 230.0, "cbop-psi5": 220.0}

    def true_values(run_dir: Path, count: int) -> dict[str, float]:
        value = measured[run_dir.parent.name] + run_dir.name.count("1")
        return {"states": count, "mc_value": value, "q_phi": value - 10, "episode_length_mean": 9}

    monkeypatch.setattr(fqe_check, "true_values", true_values)
    out = fqe_check.check(results, DATASET, 7)
    assert [(r["psi"], r["seed"]) for r in out["runs"]] == [(2.0, 0), (2.0, 1), (5.0, 0)]
    assert out["per_psi"] == [
        {"psi": 2.0, "seeds": 2, "fqe_value": 125.0, "mc_value": 230.5, "final": 23.0},
        {"psi": 5.0, "seeds": 1, "fqe_value": 180.0, "mc_value": 220.0, "final": 19.0},
    ]
    assert out["spearman_fqe_mc"] == -1.0 and out["spearman_mc_final"] == 1.0
    assert json.loads((results / DATASET / fqe_check.CHECK_NAME).read_text()) == out
    assert "| 2 | 0 | 120.0 | 230.0 | -110.0 | -10.0 | 9 | 25.0 |" in fqe_check.table(out)


def test_initial_states_are_the_episodes_first_rows():
    obs = torch.arange(6.0).unsqueeze(-1)  # episodes: rows 0-2, 3-4, 5
    done = torch.tensor([False, False, True, False, True, True]).unsqueeze(-1)
    data = TensorDict({"observation": obs, ("next", "done"): done}, batch_size=[6])
    starts = fqe_check.initial_states(data, count=10)
    assert sorted(starts.squeeze(-1).tolist()) == [0.0, 3.0, 5.0]
    assert fqe_check.initial_states(data, count=2).shape == (2, 1)


def test_a_trajectory_settles_over_its_last_half():
    from benchmarks import fqe_trajectory

    scores = [(1000, 50.0), (2000, 120.0), (3000, 130.0), (4000, 110.0)]
    assert fqe_trajectory.settle(scores) == {
        "last": 110.0,
        "half_min": 110.0,
        "half_max": 130.0,
        "half_mean": 120.0,
    }
