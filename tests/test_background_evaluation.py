"""Evaluation beside training (``eval.background=true``).

An evaluation due at step s runs in a worker thread on a copy of the weights taken at s;
the gradient steps go on meanwhile; the record is logged at s once it is done, a
checkpoint waits for it, and a run's history equals the in-line evaluation's.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from d4rl_files import write_d4rl_hdf5
from test_config import composed
from torchrl.envs import EnvBase

from cbop_torchrl.config import load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.envs import make_eval_env
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.registry import Task
from cbop_torchrl.trainers import hooks, offline


class _Summary:
    def __init__(self, score: float) -> None:
        self.score = score

    def summary(self) -> dict[str, float]:
        return {
            "normalized_score_mean": self.score,
            "normalized_score_std": 0.0,
            "return_mean": self.score,
        }


def _pendulum() -> EnvBase:
    """One Pendulum-v1 environment (observation 3, action 1) for the hook's collectors."""
    return make_eval_env(Task("Pendulum-v1", "Pendulum-v1"), 1)


class _Logger:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, int]] = []

    def log_scalar(self, name: str, value: float, step: int) -> None:
        self.rows.append((name, value, step))


def test_the_steps_go_on_while_an_evaluation_runs_and_it_is_logged_at_its_step(
    monkeypatch,
) -> None:
    release, started = threading.Event(), threading.Event()
    seen_threads = []

    def slow_evaluation(evaluator, task, seed, fork_rng=True):
        seen_threads.append(threading.current_thread().name)
        started.set()
        assert release.wait(timeout=30)
        # The score is the weights' sum: it tells which weights were evaluated.
        weights = sum(float(p.sum()) for p in evaluator.policy.parameters())
        return _Summary(weights)

    monkeypatch.setattr(hooks, "run_evaluator", slow_evaluation)
    actor = make_actor(3, 1, (8,))
    config = SimpleNamespace(
        eval=SimpleNamespace(interval=10, max_steps=5), seed=0
    )  # what the hook reads
    logger = _Logger()
    hook = hooks.EvaluationHook(actor, None, _pendulum(), config, logger, 100, background=True)
    trainer = SimpleNamespace(collected_frames=0)
    hook.trainer = trainer
    weights_at_10 = sum(float(p.detach().sum()) for p in actor.parameters())

    for step in range(10, 20):  # steps 10..19: the evaluation of step 10 is not done yet
        trainer.collected_frames = step
        hook()
        if step == 10:
            assert started.wait(timeout=30)
            with torch.no_grad():  # training moves the weights on
                for parameter in actor.parameters():
                    parameter.add_(1.0)
    assert trainer.collected_frames == 19 and hook.history == [] and logger.rows == []
    assert seen_threads and seen_threads[0].startswith("evaluation")

    release.set()
    state = hook.state_dict()  # a checkpoint waits for the running evaluation
    assert [record["step"] for record in state["history"]] == [10]
    assert abs(state["history"][0]["return_mean"] - weights_at_10) < 1e-4
    assert {step for _, _, step in logger.rows} == {10}
    hook.close()


def test_a_run_evaluated_in_the_background_has_the_in_line_runs_history(tmp_path: Path) -> None:
    dataset = write_d4rl_hdf5(tmp_path / "hopper-medium-replay-tiny.hdf5", episode_lengths=[60] * 5)
    data, info = load_dataset_with_info(dataset)
    histories = []
    for background in ("false", "true"):
        values = composed(
            "preset=debug", f"env={dataset}", "device=cpu", "logger=none", "progress=false",
            "bc.steps=4", "fqe.steps=4", "train.epochs=1", "train.steps_per_epoch=20",
            "train.log_interval=10", "train.checkpoint_interval=10", "eval.episodes=1",
            "eval.max_steps=5", "eval.interval=5", f"eval.background={background}",
        )  # fmt: skip
        config, _ = load_config(values, lambda env: (info.family, info.name))
        results = offline.run_pipeline(config, info, data, tmp_path / f"run-{background}")
        histories.append(results["eval_history"])
    inline, background = histories
    assert [record["step"] for record in background] == [5, 10, 15, 20]
    assert background == inline


def _blocking_hook(monkeypatch, release: threading.Event, evaluated: list):
    """An evaluation hook (interval 10, in the background) whose evaluations wait for
    ``release`` and append ``(policy, thread name)`` to ``evaluated``."""

    def blocking_evaluation(evaluator, task, seed, fork_rng=True):
        evaluated.append((evaluator.policy, threading.current_thread().name))
        assert release.wait(timeout=30)
        return _Summary(float(len(evaluated)))

    monkeypatch.setattr(hooks, "run_evaluator", blocking_evaluation)
    actor = make_actor(3, 1, (8,))
    config = SimpleNamespace(eval=SimpleNamespace(interval=10, max_steps=5), seed=0)
    hook = hooks.EvaluationHook(actor, None, _pendulum(), config, _Logger(), 100, background=True)
    hook.trainer = SimpleNamespace(collected_frames=0)
    return hook, actor


def test_the_copy_an_evaluation_scores_is_on_the_cpu_and_apart_from_the_trained_weights(
    monkeypatch,
) -> None:
    release, evaluated = threading.Event(), []
    release.set()
    hook, actor = _blocking_hook(monkeypatch, release, evaluated)
    hook.trainer.collected_frames = 10
    hook()
    hook.drain()
    ((policy, _),) = evaluated
    trained = {p.data_ptr() for p in actor.parameters()}
    copied = list(policy.parameters())
    assert copied and {p.device for p in copied} == {torch.device("cpu")}
    assert not trained & {p.data_ptr() for p in copied}
    hook.close()


def test_an_evaluation_due_while_the_last_one_runs_waits_for_it(monkeypatch) -> None:
    """At most one evaluation runs at a time: the one due at step 20 waits for step 10's,
    which is then written, and training is told once how long it waited."""
    release, evaluated = threading.Event(), []
    hook, _ = _blocking_hook(monkeypatch, release, evaluated)
    hook.trainer.collected_frames = 10
    hook()
    deadline = time.monotonic() + 30
    while not evaluated and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(evaluated) == 1

    hook.trainer.collected_frames = 20
    caught = []

    def due_at_20() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            hook()
        caught.extend(str(w.message) for w in seen)

    step_20 = threading.Thread(target=due_at_20)
    step_20.start()
    step_20.join(timeout=0.5)
    assert step_20.is_alive() and [r["step"] for r in hook.history] == []  # it waits
    release.set()
    step_20.join(timeout=30)
    assert not step_20.is_alive()
    assert [r["step"] for r in hook.history] == [10]
    deadline = time.monotonic() + 30
    while len(evaluated) < 2 and time.monotonic() < deadline:  # step 20's, in the worker
        time.sleep(0.01)
    assert len(evaluated) == 2
    assert hook.waited_seconds >= 0.4
    assert len(caught) == 1 and "due at step 20 waited" in caught[0]
    assert "eval.interval" in caught[0]
    hook.drain()
    assert [r["step"] for r in hook.history] == [10, 20]
    hook.close()
