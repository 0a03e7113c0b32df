"""``cbop-score``: snapshots scored on the CPU into the benchmark's seed summaries.

One debug run on the bundled demo data trains with a snapshot every 20 steps and no
evaluation during training (``eval.interval=0``: only the end-of-run one); the scorer's
records must equal a direct evaluation of the same actor by the training's own
evaluation hook (reset and start states) and the conservatism measure of the final
checkpoint (Q - MC), and its seed summary must carry what ``benchmarks/learning.py``
writes and be read by its ``rows.json`` writer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from inprocess import run_program

from benchmarks import learning
from benchmarks.set_files import PROVENANCE_KEYS
from cbop_torchrl.envs import make_eval_env, resolve_task
from cbop_torchrl.envs.starts import START_STATES_SEED, pick_start_states
from cbop_torchrl.evaluation.analysis import load_cbop_loss
from cbop_torchrl.evaluation.snapshot_scores import (
    PROVENANCE_KEYS as SCORER_PROVENANCE_KEYS,
)
from cbop_torchrl.evaluation.snapshot_scores import SCORES_NAME, load_scoring_config
from cbop_torchrl.trainers.checkpoint import load_policy
from cbop_torchrl.trainers.conservatism import dataset_conservatism, start_states
from cbop_torchrl.trainers.hooks import EvaluationHook
from cbop_torchrl.trainers.snapshots import snapshot_path

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = (
    "preset=debug", "progress=false", "estimator.rollout_dtype=float32", "eval.interval=0",
    "eval.snapshot_interval=20",
)  # fmt: skip
# A committed summary of benchmarks/learning.py: the fields a seed summary has.
LEARNING_SUMMARY = ROOT / "benchmarks/results/hopper-medium-replay-gen/cbop-psi2/seed0.json"


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run with snapshots, scored once: its folder, cache, results folder and the output."""
    root = tmp_path_factory.mktemp("score")
    env = {"CBOP_TORCHRL_CACHE": str(root / "cache")}
    done = run_program("cbop", [*OVERRIDES, f"hydra.run.dir={root / 'runs' / 'psi-run'}"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = root / "results"
    done = run_program("score", [f"paths={root / 'runs'}", f"results={results}"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"run": root / "runs" / "psi-run", "cache": root / "cache", "results": results,
            "out": done.stdout, "env": env}  # fmt: skip


def summary_path(scored: dict) -> Path:
    (path,) = scored["results"].glob("*/*/seed0.json")
    return path


def test_the_seed_summary_has_learning_py_fields_and_rows_read_it(scored: dict) -> None:
    path = summary_path(scored)
    assert path.parent.name == "cbop-debug-psi5"  # cbop-<preset>-psi<psi>
    summary = json.loads(path.read_text())
    expected = set(json.loads(LEARNING_SUMMARY.read_text())) - {"slices"}
    assert expected - set(summary) == set()
    assert [step for step, _ in summary["curve"]] == [20, 40]
    assert summary["start_states"]["states"] == 100
    assert summary["analysis"]["conservatism"]["states"] == 100
    assert summary["dataset_provenance"]["sha256"]
    dataset = path.parent.parent.name
    rows_path = learning.write_rows(scored["results"], dataset)
    rows = json.loads(rows_path.read_text())["rows"]
    assert {row["variant"] for row in rows} == {"cbop-debug-psi5"}
    reset = next(row for row in rows if row["measure"] == "reset")
    assert reset["final_per_seed"] == [pytest.approx(summary["final_normalized_score"])]
    assert SCORER_PROVENANCE_KEYS == PROVENANCE_KEYS


def test_scores_equal_a_direct_evaluation_of_the_same_actor(
    scored: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(scored["cache"]))
    run_dir = scored["run"]
    records = {r["step"]: r for r in json.loads((run_dir / SCORES_NAME).read_text())["records"]}
    config, data, info = load_scoring_config(run_dir)
    task = resolve_task(config.task, info)
    obs = pick_start_states(data.get("observation"), 100, START_STATES_SEED)
    for step in (20, 40):
        actor, _, _ = load_policy(snapshot_path(run_dir, step))
        env = make_eval_env(task, config.eval.episodes, config.eval.backend)
        hook = EvaluationHook(actor, task, env, config, None, 40, start_obs=obs)
        hook.evaluate(step)
        hook.close()
        env.close()
        direct = hook.history[-1]
        for key in ("normalized_score_mean", "return_mean", "start_normalized_score_mean",
                    "start_return_mean", "start_normalized_score_std"):  # fmt: skip
            assert records[step][key] == direct[key], (step, key)
    # the run's own end-of-run evaluation scored the same final actor
    results = json.loads((run_dir / "results.json").read_text())
    assert records[40]["normalized_score_mean"] == results["normalized_score_mean"]
    # Q - MC at the same states, as the conservatism measure of the final checkpoint gives it
    loss, config, data, _ = load_cbop_loss(run_dir)
    measured = dataset_conservatism(
        loss, task, start_states(data, 100, 0), config.agent.gamma,
        max_steps=config.eval.max_steps,
    )  # fmt: skip
    ours = records[40]["conservatism"]
    for key in ("predicted_q_mean", "predicted_q_min", "mc_return_mean", "episode_length_mean",
                "overestimation", "overestimation_max"):  # fmt: skip
        assert ours[key] == pytest.approx(measured[key], rel=1e-5, abs=1e-5), key
    assert ours["alpha"] > 0 and ours["entropy_part_mean"] != 0  # the soft critic's part


def test_scoring_again_skips_what_is_scored(scored: dict, tmp_path: Path) -> None:
    path = summary_path(scored)
    before = (path.stat().st_mtime_ns, (scored["run"] / SCORES_NAME).stat().st_mtime_ns)
    done = run_program(
        "score", [f"paths={scored['run']}", f"results={scored['results']}"], scored["env"]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "snapshot at step" not in done.stdout
    assert before == (path.stat().st_mtime_ns, (scored["run"] / SCORES_NAME).stat().st_mtime_ns)
    # an unfinished run (no results.json) is scored, and gets no summary yet
    unfinished = tmp_path / "unfinished"
    shutil.copytree(scored["run"], unfinished)
    (unfinished / "results.json").unlink()
    (unfinished / SCORES_NAME).unlink()
    done = run_program("score", [f"paths={unfinished}", f"results={tmp_path / 'r'}"], scored["env"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("snapshot at step") == 2 and "has not finished" in done.stdout
    assert not (tmp_path / "r").exists()


def refused(argv: list[str], env: dict) -> str:
    done = run_program("score", argv, env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = done.stderr.strip()
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_refusals_before_any_work(scored: dict, tmp_path: Path) -> None:
    env, results = scored["env"], f"results={tmp_path / 'results'}"
    message = refused([f"paths={tmp_path / 'nowhere'}", results], env)
    assert "is not a folder" in message
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a run")
    message = refused([f"paths={tmp_path / 'notes'}", results], env)
    assert "is not a run directory and holds none" in message
    bare = tmp_path / "bare"
    shutil.copytree(scored["run"], bare, ignore=shutil.ignore_patterns("snapshots"))
    message = refused([f"paths={bare}", results], env)
    assert "no snapshots found in 1 run(s)" in message and "eval.snapshot_interval=" in message
    assert not (tmp_path / "results").exists()
