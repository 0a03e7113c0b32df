"""Measurements in a thread beside training: they read no process-wide setting that training
changes (TorchRL's exploration type, the global random stream), and the learning
diagnostics measured in the background equal the in-line ones."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from d4rl_files import write_d4rl_hdf5
from inprocess import run_program
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.envs.evaluate import evaluate_policy
from cbop_torchrl.envs.gym import make_eval_env
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.registry import get_family


def test_an_evaluation_in_a_thread_ignores_the_exploration_type_training_sets() -> None:
    """Training holds ``ExplorationType.RANDOM`` around its actor calls, from its own thread,
    most of the time; an evaluation in a worker must still take the deterministic actions
    and draw nothing from the global stream."""
    task = get_family("hopper")
    torch.manual_seed(0)
    actor = make_actor(11, 3, (16,))
    in_line = evaluate_policy(actor, task, make_eval_env(task, 2), max_steps=40, seed=3)

    env = make_eval_env(task, 2)
    torch.manual_seed(1)
    stream = torch.get_rng_state()
    with ThreadPoolExecutor(max_workers=1) as worker:
        future = worker.submit(evaluate_policy, actor, task, env, 40, 3, False)
        while not future.done():  # what training's loss does on every step
            with set_exploration_type(ExplorationType.RANDOM):
                time.sleep(0.0005)
        beside = future.result()
    assert beside.returns == in_line.returns
    assert torch.equal(torch.get_rng_state(), stream)  # the worker drew nothing


def _diagnostics_history(tmp_path: Path, dataset: Path, background: str) -> list[dict]:
    run_dir = tmp_path / f"run-{background}"
    argv = [
        "preset=debug", f"env={dataset}", f"hydra.run.dir={run_dir}", "progress=false",
        "logger=none", "bc.steps=4", "fqe.steps=4", "train.epochs=1",
        "train.steps_per_epoch=30", "train.log_interval=10", "train.checkpoint_interval=10",
        "eval.episodes=1", "eval.max_steps=20", "eval.interval=10", "eval.mc_states=2",
        "eval.diagnostics=true", "estimator.rollout_dtype=float32",
        f"eval.background={background}",
    ]  # fmt: skip
    done = run_program("cbop", argv, {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((run_dir / "results.json").read_text())["diagnostics_history"]


def test_diagnostics_measured_in_the_background_equal_the_in_line_ones(tmp_path: Path) -> None:
    dataset = write_d4rl_hdf5(
        tmp_path / "hopper-medium-replay-tiny.hdf5", episode_lengths=[60] * 5,
        terminal_episodes=(0,),
    )  # fmt: skip
    in_line = _diagnostics_history(tmp_path, dataset, "false")
    background = _diagnostics_history(tmp_path, dataset, "true")
    assert [record["step"] for record in background] == [0, 10, 20, 30]
    assert background == in_line


def test_the_steps_go_on_while_diagnostics_are_measured(monkeypatch) -> None:
    """A measurement due at step s runs in a worker; the hook returns at once, later steps'
    hooks run while it is measuring, and its record is written at s once it is done."""
    from types import SimpleNamespace

    from cbop_torchrl.trainers import diagnostics as module

    release, started = threading.Event(), threading.Event()

    def slow_measure(self, step, horizons, model):
        started.set()
        assert release.wait(timeout=30)
        return {"step": step, "weights": float(model.actor_network_params["w"].sum())}

    monkeypatch.setattr(module.LearningDiagnostics, "_measure", slow_measure)
    monkeypatch.setattr(module.LearningDiagnostics, "_horizons_at", lambda self, step: {})
    monkeypatch.setattr(
        module.LearningDiagnostics,
        "_snapshot",
        lambda self: SimpleNamespace(actor_network_params={"w": self.loss.w.clone()}),
    )
    hook = module.LearningDiagnostics.__new__(module.LearningDiagnostics)
    hook.loss, hook.logger, hook.interval, hook.total_steps = (
        SimpleNamespace(w=torch.zeros(3)), None, 10, 100,
    )  # fmt: skip
    hook.history, hook.background, hook._worker = [], True, None
    hook._pending = module.deque()
    hook.trainer = SimpleNamespace(collected_frames=0)
    for step in range(10, 20):
        hook.trainer.collected_frames = step
        hook()
        if step == 10:
            assert started.wait(timeout=30)
            hook.loss.w += 1.0  # training moves the weights on
    assert hook.history == []
    release.set()
    state = hook.state_dict()  # a checkpoint waits for the running measurement
    assert state["history"] == [{"step": 10, "weights": 0.0}]
    hook.close()
