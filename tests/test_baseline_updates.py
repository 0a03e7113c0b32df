"""The baselines' update steps, as their authors' code takes them.

- IQL: with ``value_first`` (its recipe, as its authors' ``learner.py``) the value network
  takes its Adam step first and the actor and critics then read the new V; ``together``
  (TorchRL's ``IQLLoss`` and CORL) computes all three losses from the same parameters. The
  baseline's stepper is compared with the same updates written out by hand, with one Adam per
  network.
- TD3+BC: the target networks move on the delayed actor's steps only."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from batches import random_transitions
from torchrl.objectives import SoftUpdate
from torchrl.trainers import Trainer

from cbop_torchrl.baselines import (
    AlgoConfig,
    BaselineConfigError,
    BaselineParts,
    _params,
    build_baseline,
)
from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.trainers.checkpoint import CheckpointHook, NonFiniteLossError
from cbop_torchrl.trainers.grouped_step import GroupedOptimizationStepper
from cbop_torchrl.trainers.hooks import DelayedTargetUpdate

CONFIGS = Path(__file__).resolve().parents[1] / "cbop_torchrl" / "configs" / "algo"
OBS, ACT, ROWS, STEPS = 4, 2, 32, 4
LR = 1e-2  # large, so that one step's change of V shows in the next losses


def _parts(update_order: str) -> BaselineParts:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=OBS, action_dim=ACT)
    algo = AlgoConfig(
        name="iql", hidden_sizes=[8], actor_lr=LR, critic_lr=LR, value_lr=LR,
        update_order=update_order,
    )  # fmt: skip
    torch.manual_seed(0)
    return build_baseline(algo, RunConfig(), info, torch.device("cpu"))


def _batches() -> list:
    return [random_transitions([ROWS], OBS, ACT, seed=10 + i) for i in range(STEPS)]


def _stepper_run(parts: BaselineParts, tmp_path: Path) -> list[dict[str, float]]:
    """``STEPS`` steps of the baseline's stepper on a stand-in for TorchRL's ``Trainer`` that
    has what the stepper reads (its ``compute_loss`` is ``Trainer``'s own)."""
    optimizer = torch.optim.Adam([{"params": p, "lr": lr} for _, p, lr, _ in parts.groups])
    trainer = SimpleNamespace(loss_module=parts.loss, optimizer=optimizer, _optim_count=0)
    trainer.compute_loss = partial(Trainer.compute_loss, trainer)
    checkpoint = CheckpointHook(tmp_path / "checkpoint.pt", 100, STEPS, dict)
    stepper = GroupedOptimizationStepper(
        parts.groups, checkpoint, "iql", stepped_first=parts.stepped_first
    )
    logged = []
    for batch in _batches():
        trainer._optim_count += 1
        out = stepper.step(trainer, batch)
        logged.append({key: float(out.get(key)) for key in ("loss_value", "loss_actor")})
    return logged


def _value_first_by_hand(parts: BaselineParts) -> list[float]:
    """The authors' order with one Adam per network; returns each step's value loss."""
    loss = parts.loss
    nets = {
        name: (params, torch.optim.Adam(params, lr=LR))
        for name, params in (
            ("value", _params(loss.value_network_params)),
            ("actor", _params(loss.actor_network_params)),
            ("critic", _params(loss.qvalue_network_params)),
        )
    }
    value_losses = []
    for batch in _batches():
        value_loss = loss.value_loss(batch.clone())[0]
        value_losses.append(float(value_loss.detach()))
        _step(nets["value"], value_loss)
        td = batch.clone()
        actor_loss = loss.actor_loss(td)[0]  # V(s) of the stepped value network
        critic_loss = loss.qvalue_loss(td)[0]  # V(s') of the stepped value network
        _step(nets["actor"], actor_loss)
        _step(nets["critic"], critic_loss)
    return value_losses


def _step(net: tuple[list, torch.optim.Optimizer], objective: torch.Tensor) -> None:
    params, optimizer = net
    grads = torch.autograd.grad(objective, params, retain_graph=True, allow_unused=True)
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state(parts: BaselineParts) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in parts.loss.state_dict().items()}


def test_value_first_steps_v_before_the_actor_and_critics_read_it(tmp_path: Path) -> None:
    stepped = _parts("value_first")
    logged = _stepper_run(stepped, tmp_path)
    by_hand = _parts("value_first")
    hand_value_losses = _value_first_by_hand(by_hand)
    for key, value in _state(stepped).items():
        torch.testing.assert_close(value, _state(by_hand)[key], rtol=0, atol=1e-6, msg=key)
    # the logged value loss is the one its step followed, not a recomputation after it
    assert [row["loss_value"] for row in logged] == pytest.approx(hand_value_losses, rel=1e-6)

    together = _parts("together")
    _stepper_run(together, tmp_path)
    differ = {
        key
        for key, value in _state(stepped).items()
        if (value - _state(together)[key]).abs().max() > 1e-4
    }
    assert any("actor" in key for key in differ), differ
    assert any(key.startswith("qvalue") for key in differ), differ


def test_the_recipe_updates_v_first_and_a_wrong_order_is_a_clear_error() -> None:
    recipe = AlgoConfig.from_dict(yaml.safe_load((CONFIGS / "iql.yaml").read_text()))
    assert recipe.update_order == "value_first"
    assert _parts("value_first").stepped_first == ("value_loss", "loss_value")
    assert _parts("together").stepped_first is None
    with pytest.raises(BaselineConfigError, match="algo.update_order=value_first"):
        AlgoConfig.from_dict({"name": "iql", "update_order": "value"})


def test_a_non_finite_value_loss_stops_before_the_value_network_moves(tmp_path: Path) -> None:
    parts = _parts("value_first")
    before = _state(parts)
    batch = random_transitions([ROWS], OBS, ACT)
    batch.set("action", torch.full((ROWS, ACT), float("nan")))  # Q(s, a) and V's target NaN
    optimizer = torch.optim.Adam([{"params": p, "lr": lr} for _, p, lr, _ in parts.groups])
    trainer = SimpleNamespace(loss_module=parts.loss, optimizer=optimizer, _optim_count=1)
    trainer.compute_loss = partial(Trainer.compute_loss, trainer)
    checkpoint = CheckpointHook(tmp_path / "checkpoint.pt", 100, 1, dict)
    stepper = GroupedOptimizationStepper(
        parts.groups, checkpoint, "iql", stepped_first=parts.stepped_first
    )
    with pytest.raises(NonFiniteLossError, match="non-finite loss_value.* at gradient step 1 "):
        stepper.step(trainer, batch)
    for key, value in _state(parts).items():
        assert torch.equal(value, before[key]), key


def test_td3bcs_target_networks_move_only_with_its_delayed_actor(tmp_path: Path) -> None:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=OBS, action_dim=ACT)
    algo = AlgoConfig(name="td3bc", hidden_sizes=[8], actor_lr=LR, critic_lr=LR, policy_delay=2)
    torch.manual_seed(0)
    parts = build_baseline(algo, RunConfig(), info, torch.device("cpu"))
    assert parts.target_every == 2
    optimizer = torch.optim.Adam([{"params": p, "lr": lr} for _, p, lr, _ in parts.groups])
    registered = []
    trainer = SimpleNamespace(
        loss_module=parts.loss, optimizer=optimizer, _optim_count=0,
        register_op=lambda where, op: registered.append((where, op)),
    )  # fmt: skip
    trainer.compute_loss = partial(Trainer.compute_loss, trainer)
    hook = DelayedTargetUpdate(SoftUpdate(parts.loss, tau=0.5), parts.target_every)
    hook.register(trainer)
    assert registered == [("post_optim", hook)]
    checkpoint = CheckpointHook(tmp_path / "checkpoint.pt", 100, STEPS, dict)
    stepper = GroupedOptimizationStepper(parts.groups, checkpoint, "td3bc")

    def targets() -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in _state(parts).items() if k.startswith("target_")}

    moved, actor_moved = [], []
    for batch in _batches():
        trainer._optim_count += 1
        before, actor_before = targets(), _state(parts)
        stepper.step(trainer, batch)
        hook()
        after = targets()
        moved.append(any(not torch.equal(after[k], before[k]) for k in after))
        actor_moved.append(
            any(
                not torch.equal(v, actor_before[k])
                for k, v in _state(parts).items()
                if k.startswith("actor_network_params")
            )
        )
    assert actor_moved == [False, True, False, True]
    assert moved == actor_moved  # the authors' TD3+BC: targets with the actor
