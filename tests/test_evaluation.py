"""Vectorized deterministic evaluation and the NaN guard of the CBOP stage."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.envs import describe_score, evaluate_policy, make_eval_env
from cbop_torchrl.envs.evaluate import deterministic_policy
from cbop_torchrl.envs.starts import restore_states
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.registry import Task, get_family
from cbop_torchrl.trainers.cbop_stage import GuardedOptimizationStepper
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError
from cbop_torchrl.trainers.hooks import ActorWeightAverage


def _rollout_evaluation(
    actor: Any, env: EnvBase, max_steps: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluator before the collector, kept as the reference: ``env.rollout`` to the
    last done, each episode's per-step rewards ``[N, T]`` (zero after its first done) and
    its length ``[N]``."""
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        env.set_seed(seed)
        rollout = env.rollout(
            max_steps, deterministic_policy(actor), break_when_all_done=True,
            auto_cast_to_device=True,
        )  # fmt: skip
    reward = rollout.get(("next", "reward")).squeeze(-1)
    done = rollout.get(("next", "done")).squeeze(-1)
    alive = (done.long().cumsum(-1) - done.long()) == 0  # no done at an earlier step
    return reward * alive, alive.sum(-1)


@pytest.mark.parametrize(
    ("gym_id", "sizes", "max_steps", "lengths"),
    [
        ("Hopper-v4", (11, 3), 8, {8}),  # every episode truncated by the cap
        ("Hopper-v4", (11, 3), 60, {21}),  # every episode terminated before it
        ("InvertedPendulum-v4", (4, 1), 60, {28, 32, 34}),  # ended ones are stepped on
    ],
)
def test_the_collector_scores_the_episodes_of_the_rollout_evaluator(
    gym_id: str, sizes: tuple[int, int], max_steps: int, lengths: set[int]
) -> None:
    """Episode for episode, the collector's ``RewardSum`` returns and ``StepCounter`` lengths
    are those of ``env.rollout``'s episodes, for the same seeds (``seed + i``), whether the
    cap or the task ends them, and when they end at different steps.

    RewardSum adds an episode's float32 rewards one step after another: the return equals
    that sum of the rollout's rewards exactly, and the rollout's vectorised
    ``rewards.sum(-1)`` (the evaluator before) to float32 rounding of a ``T``-term sum.
    """
    task = Task(gym_id, gym_id)
    torch.manual_seed(2)
    actor = make_actor(*sizes, (16, 16))
    env = make_eval_env(task, num_envs=4)
    try:
        rewards, reference_lengths = _rollout_evaluation(actor, env, max_steps, seed=3)
        result = evaluate_policy(actor, task, env, max_steps=max_steps, seed=3)
    finally:
        env.close()
    assert result.lengths == reference_lengths.tolist()
    assert set(result.lengths) == lengths
    step_by_step = [float(sum(row.unbind(0), torch.zeros(()))) for row in rewards]
    assert result.returns == step_by_step
    rounding = max_steps * torch.finfo(torch.float32).eps * rewards.abs().sum(-1)
    assert ((torch.tensor(result.returns) - rewards.sum(-1)).abs() <= rounding).all()


def test_deterministic_evaluation_is_reproducible_and_leaves_the_rng_alone() -> None:
    family = get_family("hopper")
    torch.manual_seed(0)
    actor = make_actor(11, 3, (16,))
    env = make_eval_env(family, num_envs=3)
    try:
        rng_before = torch.get_rng_state()
        first = evaluate_policy(actor, family, env, max_steps=30, seed=5)
        assert torch.equal(rng_before, torch.get_rng_state())
        second = evaluate_policy(actor, family, env, max_steps=30, seed=5)
        other_seed = evaluate_policy(actor, family, env, max_steps=30, seed=6)
    finally:
        env.close()
    assert len(first.returns) == 3 and all(1 <= n <= 30 for n in first.lengths)
    assert first.returns == second.returns
    assert first.returns != other_seed.returns
    assert first.normalized_scores == [family.normalized_score(r) for r in first.returns]
    summary = first.summary()
    assert summary["episodes"] == 3
    assert summary["normalized_score_mean"] == pytest.approx(
        sum(first.normalized_scores) / 3, rel=1e-6
    )


def test_halfcheetah_envs_print_no_mujoco_warning(capfd: pytest.CaptureFixture[str]) -> None:
    """HalfCheetah-v4's model has an attribute MuJoCo 3+ calls deprecated; MuJoCo's handler
    prints it on every model load (one per evaluation env, thousands a run). The package's
    envs, the batched ones and the start-state evaluation's, turn it into a filtered Python
    warning: nothing reaches the console."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        env = make_eval_env(get_family("halfcheetah"), num_envs=3)
        env.reset()  # the batched env makes its members on first use
        env.close()
        start_obs = torch.zeros(2, 17)  # the start-state evaluation makes one env per state
        envs, _ = restore_states(get_family("halfcheetah"), start_obs)
        for member in envs:
            member.close()
    out, err = capfd.readouterr()
    assert "settotalmass" not in out + err
    assert not [w for w in caught if "settotalmass" in str(w.message)]


def test_a_task_without_reference_scores_reports_the_raw_return_only() -> None:
    swimmer = Task("Swimmer-v4", "Swimmer-v4")  # no entry in the registry, no ref scores
    torch.manual_seed(0)
    actor = make_actor(8, 2, (16,))
    env = make_eval_env(swimmer, num_envs=2)
    try:
        result = evaluate_policy(actor, swimmer, env, max_steps=20, seed=0)
    finally:
        env.close()
    summary = result.summary()
    assert summary["normalized_score_mean"] is None and summary["normalized_scores"] is None
    assert len(summary["returns"]) == 2 and all(n == 20 for n in result.lengths)
    assert summary["return_mean"] == pytest.approx(sum(result.returns) / 2)
    assert "no normalized score" in describe_score(summary)


class _FakeCheckpoint:
    def describe_last(self) -> str:
        return "run/checkpoint.pt (gradient step 100)"


class _FakeTrainer:
    def __init__(self, parameter: torch.nn.Parameter, loss_value: float) -> None:
        self.parameter = parameter
        self.loss_value = loss_value
        self.optimizer = torch.optim.SGD([parameter], lr=0.1)
        self.collected_frames = 123

    def compute_loss(self, batch: TensorDict) -> TensorDict:
        loss = (self.parameter * self.loss_value).sum()
        return TensorDict({"loss_qvalue": loss, "cbop": {"target_mean": loss.detach()}}, [])


def test_non_finite_loss_stops_before_any_update() -> None:
    parameter = torch.nn.Parameter(torch.ones(3))
    stepper = GuardedOptimizationStepper(_FakeCheckpoint())
    stepper.step(_FakeTrainer(parameter, 1.0), TensorDict())
    assert torch.allclose(parameter.detach(), torch.full((3,), 0.9))  # a finite step is taken

    with pytest.raises(NonFiniteLossError) as error:
        stepper.step(_FakeTrainer(parameter, float("nan")), TensorDict())
    message = str(error.value)
    assert "gradient step 123" in message and "run/checkpoint.pt (gradient step 100)" in message
    assert "loss_qvalue" in message and "cbop/target_mean" in message
    assert torch.allclose(parameter.detach(), torch.full((3,), 0.9))  # untouched


def test_actor_weight_average_is_an_exponential_moving_average_of_a_copy() -> None:
    torch.manual_seed(0)
    actor = make_actor(4, 2, [8])
    average = ActorWeightAverage(actor, decay=0.75)
    expected = {k: v.clone() for k, v in actor.state_dict().items()}
    for _ in range(3):
        with torch.no_grad():
            for parameter in actor.parameters():
                parameter.add_(torch.randn_like(parameter))
        average()
        for key, value in actor.state_dict().items():
            expected[key] = 0.75 * expected[key] + 0.25 * value
    averaged = average.averaged.state_dict()
    for key, value in averaged.items():
        torch.testing.assert_close(value, expected[key])
    assert any(not torch.equal(v, actor.state_dict()[k]) for k, v in averaged.items())
    assert not any(p.requires_grad for p in average.averaged.parameters())

    other = ActorWeightAverage(actor, decay=0.75)
    other.load_state_dict(average.state_dict())  # what a checkpoint restores
    for key, value in other.averaged.state_dict().items():
        assert torch.equal(value, average.averaged.state_dict()[key])
    average.restart()
    for key, value in average.averaged.state_dict().items():
        assert torch.equal(value, actor.state_dict()[key])
