"""The start-state evaluation (eval.start_states) and the score measures of a summary."""

from __future__ import annotations

import json
import math
import runpy
import statistics
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from inprocess import run_program

from cbop_torchrl.envs.starts import (
    evaluate_from_states,
    pick_start_states,
    restore_states,
    rollout_restored,
)
from cbop_torchrl.evaluation.analysis import (
    consecutive_noise,
    hierarchical_bootstrap,
    row_intervals,
    score_measures,
)
from cbop_torchrl.registry import get_family

ACTION = [0.3, -0.2, 0.1]
ROOT = Path(__file__).resolve().parents[1]


def constant_actor(td):
    return td.set("action", torch.tensor(ACTION).expand(td.shape[0], 3))


def hopper_states(count: int, steps: int = 15) -> torch.Tensor:
    """``count`` distinct hopper observations: resets moved on by ``steps`` random actions."""
    family = get_family("hopper")
    env = gymnasium.make(family.gym_id)
    rng = np.random.default_rng(0)
    states = []
    for index in range(count):
        obs, _ = env.reset(seed=index)
        for _ in range(steps + 5 * index):
            obs, *_ = env.step(rng.uniform(-0.5, 0.5, 3))
        states.append(torch.as_tensor(obs, dtype=torch.float32))
    env.close()
    return torch.stack(states)


def test_restore_puts_the_simulator_in_the_dataset_state() -> None:
    starts = hopper_states(3)
    envs, observed = restore_states(get_family("hopper"), starts)
    for env in envs:
        env.close()
    torch.testing.assert_close(observed, starts, atol=1e-5, rtol=0)


def test_each_episode_is_the_real_rollout_from_its_state_and_returns_differ_by_state() -> None:
    family = get_family("hopper")
    starts = hopper_states(4)
    result = evaluate_from_states(constant_actor, family, starts, max_steps=40)
    # By hand for one state: restore, step the same actions, sum the undiscounted reward.
    envs, _ = restore_states(family, starts[2:3])
    expected, length = 0.0, 0
    for _ in range(40):
        _, reward, terminated, truncated, _ = envs[0].step(np.asarray(ACTION))
        expected += reward
        length += 1
        if terminated or truncated:
            break
    envs[0].close()
    assert result.returns[2] == pytest.approx(expected, rel=1e-6)
    assert result.lengths[2] == length
    # Another start state is another episode: the returns are not one trajectory repeated.
    assert len({round(r, 6) for r in result.returns}) == 4
    assert result.normalized_scores == [family.normalized_score(r) for r in result.returns]
    # Deterministic: the same states give the same returns, and the RNG is left alone.
    before = torch.random.get_rng_state()
    again = evaluate_from_states(constant_actor, family, starts, max_steps=40)
    assert again.returns == result.returns
    assert torch.equal(torch.random.get_rng_state(), before)


def test_undiscounted_and_discounted_returns_come_from_one_rollout() -> None:
    rollout = rollout_restored(constant_actor, get_family("hopper"), hopper_states(2), 0.9, 30)
    assert (rollout.returns > rollout.discounted).all()  # hopper's rewards are positive
    assert rollout.lengths.max() <= 30


def test_pick_start_states_is_a_fixed_draw_without_replacement() -> None:
    observations = torch.arange(200.0).reshape(100, 2)
    first = pick_start_states(observations, 10, 0)
    assert torch.equal(first, pick_start_states(observations, 10, 0))
    assert len(set(first[:, 0].tolist())) == 10
    assert not torch.equal(first, pick_start_states(observations, 10, 1))


def test_a_run_scores_its_start_states_beside_an_unchanged_reset_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_d4rl_hdf5(
        tmp_path / "hopper-medium-replay-tiny.hdf5",
        episode_lengths=[150] * 8,
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
    )
    env = {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")}
    histories = {}
    for name, extra in (("plain", []), ("starts", ["eval.start_states=4"])):
        run_dir = tmp_path / name
        argv = [
            "preset=debug", "algo=bc", f"env={dataset}", f"hydra.run.dir={run_dir}",
            "progress=false", "eval.interval=40", "eval.episodes=2", "eval.max_steps=50", *extra,
        ]  # fmt: skip
        done = run_program("baseline", argv, env)
        assert done.returncode == 0, done.stderr[-3000:]
        histories[name] = json.loads((run_dir / "results.json").read_text())["eval_history"]
    plain, starts = histories["plain"], histories["starts"]
    # The reset evaluation (the primary score) and training are unchanged by the extra one.
    assert [r["normalized_score_mean"] for r in starts] == [
        r["normalized_score_mean"] for r in plain
    ]
    assert not any("start_normalized_score_mean" in r for r in plain)
    for record in starts:
        assert math.isfinite(record["start_normalized_score_mean"])
        assert record["start_normalized_score_std"] > 0  # 4 states, 4 different episodes
    summary = score_measures(starts, interval=40, episodes=2, start_states=4)
    assert summary["start_states"]["states"] == 4
    assert [p[0] for p in summary["start_states"]["curve"]] == [r["step"] for r in starts]
    # benchmarks/curves.py shows the start-state score beside the reset score of a baseline.
    script = str(ROOT / "benchmarks" / "curves.py")
    monkeypatch.setattr(sys, "argv", [script, str(tmp_path / "starts")])
    capsys.readouterr()
    runpy.run_path(script, run_name="__main__")
    header = capsys.readouterr().out.splitlines()[0]
    assert header == "| step | normalized_score | start_normalized_score |"


def test_a_negative_number_of_start_states_is_refused(tmp_path: Path) -> None:
    done = run_program(
        "baseline",
        ["preset=debug", "env=demo", "eval.start_states=-1", f"hydra.run.dir={tmp_path}"],
        {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode != 0
    assert "eval.start_states=-1" in done.stderr


def synthetic_history(scores: list[float], starts: list[float] | None = None) -> list[dict]:
    history = []
    for index, score in enumerate(scores):
        record = {"step": 1000 * (index + 1), "normalized_score_mean": score}
        if starts is not None:
            record["start_normalized_score_mean"] = starts[index]
        history.append(record)
    return history[::-1]  # the measures sort by step


def test_score_measures_of_a_tiny_history() -> None:
    scores = [float(v) for v in range(1, 13)]  # 1 ... 12 at steps 1000 ... 12000
    starts = [2.0 * v for v in scores]
    measures = score_measures(synthetic_history(scores, starts), 1000, 10, start_states=5)
    assert "mean of the last 3 evaluations" in measures["final_measure"]
    assert "10 episodes from env.reset()" in measures["final_measure"]
    assert measures["last10_normalized_score"] == pytest.approx(statistics.fmean(scores[-10:]))
    low, high = measures["last10_normalized_score_ci95"]
    assert low < measures["last10_normalized_score"] < high
    assert 3.0 <= low and high <= 12.0  # within the window's values
    assert measures["eval_noise"] == pytest.approx(0.0)  # a straight line: no noise
    start = measures["start_states"]
    assert start["final_normalized_score"] == pytest.approx(2 * statistics.fmean([10, 11, 12]))
    assert start["last10_normalized_score"] == pytest.approx(2 * statistics.fmean(scores[-10:]))
    assert start["curve"][0] == [1000, 2.0]
    assert "start_states" not in score_measures(synthetic_history(scores), 1000, 10)


def test_consecutive_noise_estimates_the_noise_of_one_evaluation() -> None:
    rng = np.random.default_rng(0)
    values = 20.0 + rng.normal(0.0, 3.0, size=4000)
    assert consecutive_noise(values.tolist()) == pytest.approx(3.0, rel=0.05)
    assert consecutive_noise([1.0, 2.0]) is None
    # Alternating 0, 4: differences +-4, std 4 (ddof 1 over many) / sqrt(2).
    assert consecutive_noise([0.0, 4.0] * 50) == pytest.approx(4.0 / math.sqrt(2), rel=0.02)


def test_row_intervals_over_seeds_and_evaluations() -> None:
    summaries = []
    for seed, level in enumerate((10.0, 20.0, 30.0)):
        curve = [[1000 * i, level + (1.0 if i % 2 else -1.0)] for i in range(1, 13)]
        start_curve = [[step, score + 5.0] for step, score in curve]
        summaries.append(
            {
                "dataset": "d",
                "variant": "bc",
                "seed": seed,
                "curve": curve,
                "start_states": {"curve": start_curve},
            }
        )
    summaries.append({"dataset": "d", "variant": "iql", "seed": 0, "curve": [[1000, 7.0]]})
    # The same variant on another version of the dataset is another row.
    other_file = {"dataset_provenance": {"sha256": "f" * 64}}
    summaries.append({"dataset": "d", "variant": "bc", "seed": 0, "curve": [[1000, 99.0]]})
    summaries[-1].update(other_file)
    every = row_intervals(summaries, reps=2000)
    assert [r["last10"] for r in every if r["dataset_sha256"] == "f" * 12] == [99.0]
    # A one-seed row has no spread over seeds: no se, interval or resolution is invented.
    for row in (r for r in every if r["seeds"] == [0]):
        for name in ("final", "last10"):
            assert row[f"{name}_se"] is None and row[f"{name}_ci95"] is None, row
            assert row[f"{name}_min_difference"] is None
            assert row[f"{name}_bootstrap_ci95"] is not None  # the noise is still described
    rows = {(r["variant"], r["measure"]): r for r in every if r["dataset_sha256"] is None}
    assert set(rows) == {("bc", "reset"), ("bc", "starts"), ("iql", "reset")}
    reset = rows[("bc", "reset")]
    assert reset["seeds"] == [0, 1, 2]
    assert reset["final_window"] == 3  # not a -50k row: the earlier protocol's last 3
    assert reset["last10"] == pytest.approx(20.0)  # each seed's window averages its level
    assert reset["final"] == pytest.approx(statistics.fmean([10 - 1 / 3, 20 - 1 / 3, 30 - 1 / 3]))
    assert reset["final_per_seed"] == pytest.approx([10 - 1 / 3, 20 - 1 / 3, 30 - 1 / 3])
    assert reset["across_seed_std"] == pytest.approx(10.0)
    # The window's 9 differences are -2, +2, ..., -2 (mean -2/9): their sample variance is
    # (5 (16/9)^2 + 4 (20/9)^2) / 8 = 2880 / 648, and the noise of one evaluation its root / sqrt 2.
    assert reset["eval_noise"] == pytest.approx(math.sqrt(2880 / 648) / math.sqrt(2), rel=1e-9)
    low, high = reset["last10_bootstrap_ci95"]
    assert 10.0 <= low < 20.0 < high <= 30.0  # three seeds this far apart: a wide interval
    # Over the seed means 10, 20, 30: se 10 / sqrt(3), Student's t with 2 df (4.303).
    assert reset["last10_se"] == pytest.approx(10.0 / math.sqrt(3))
    half = 4.302653 * 10.0 / math.sqrt(3)
    assert reset["last10_ci95"] == pytest.approx([20.0 - half, 20.0 + half], rel=1e-6)
    # Against a row of the same spread and seeds: Welch's df = 4, t = 2.776.
    assert reset["last10_min_difference"] == pytest.approx(
        2.776445 * math.sqrt(2) * 10.0 / math.sqrt(3), rel=1e-6
    )
    assert rows[("bc", "starts")]["last10"] == pytest.approx(25.0)
    assert rows[("iql", "reset")]["across_seed_std"] is None


def test_the_hierarchical_bootstrap_resamples_seeds_and_evaluations() -> None:
    # One seed with no spread between evaluations: every bootstrap mean is that value.
    assert np.allclose(hierarchical_bootstrap([[5.0] * 10], reps=50), 5.0)
    # Two seeds: the means lie between them, and both seeds are drawn.
    means = hierarchical_bootstrap([[0.0] * 10, [10.0] * 10], reps=400)
    assert means.min() == 0.0 and means.max() == 10.0
    assert 4.0 < means.mean() < 6.0
