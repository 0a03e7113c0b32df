"""The authors' choices as opt-in options (``preset=paper`` turns them on; off by default).

Unbiased variance over the M x K samples, shared log-variance bounds, the dynamics bootstrap
redrawn every epoch, a separate reward ensemble with ReLU, BC fitted to held-out convergence,
FQE without terminal rows; each at debug sizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from cbop_torchrl.config import DynamicsConfig, FQEConfig, PretrainConfig
from cbop_torchrl.config.sections import BCConfig
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.modules.dynamics import (
    DynamicsModel,
    GaussianEnsemble,
    load_dynamics,
    save_dynamics,
)
from cbop_torchrl.objectives.cbop_target import horizon_value
from cbop_torchrl.objectives.posterior import VAR_FLOOR, fixed_weights, gaussian_posterior
from cbop_torchrl.objectives.pretrain import BehaviourCloningLoss
from cbop_torchrl.trainers.dynamics import _update_snapshots, train_dynamics, train_epoch
from cbop_torchrl.trainers.pretrain import (
    bc_holdout_nll,
    fit_bc_to_convergence,
    load_or_train_bc,
    load_or_train_fqe,
)

OBS, ACT = 4, 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_unbiased_variance_is_torch_var_over_the_m_by_k_samples() -> None:
    returns = torch.randn(5, 4, 3, 6, generator=torch.Generator().manual_seed(0)) * 3 + 10
    samples = returns.flatten(-2)  # (batch, H+1, K*M)
    unbiased = gaussian_posterior(returns, unbiased=True)
    population = gaussian_posterior(returns)
    torch.testing.assert_close(unbiased.var_h, torch.var(samples, dim=-1).clamp_min(VAR_FLOOR))
    torch.testing.assert_close(population.var_h, samples.var(-1, correction=0))
    torch.testing.assert_close(unbiased.var_h / population.var_h, torch.full_like(
        population.var_h, 18 / 17))  # fmt: skip
    weights = fixed_weights(3)
    _, _, sigma = horizon_value(returns, None, "lcb", 1.0, unbiased_variance=True)
    torch.testing.assert_close(sigma, unbiased.var.sqrt())
    value, _, _ = horizon_value(returns, None, "fixed", 1.0, VAR_FLOOR, weights, 0.3, True)
    combined = (returns * weights[:, None, None]).sum(-3).flatten(-2)
    torch.testing.assert_close(value, combined.mean(-1) - torch.std(combined, dim=-1))


def test_the_unbiased_variance_is_floored_after_its_factor() -> None:
    returns = torch.zeros(2, 2, 2, 3)
    assert torch.equal(gaussian_posterior(returns, unbiased=True).var_h, torch.full((2, 2), 1e-5))


def test_shared_bounds_are_one_pair_for_every_member(tmp_path: Path) -> None:
    ensemble = GaussianEnsemble(OBS, ACT, num_members=5, hidden_sizes=(16, 16),
                                shared_logvar_bounds=True)  # fmt: skip
    per_member = GaussianEnsemble(OBS, ACT, num_members=5, hidden_sizes=(16, 16))
    assert ensemble.max_logvar.shape == ensemble.min_logvar.shape == (1, 1, OBS + 1)
    assert per_member.max_logvar.shape == (5, 1, OBS + 1)
    penalty = float(ensemble.logvar_bound_penalty().detach())
    assert penalty == pytest.approx((0.5 + 10.0) * (OBS + 1))
    with torch.no_grad():
        ensemble.max_logvar.fill_(-1.0)  # every member's log-variance is capped by the one pair
    obs, action = torch.randn(7, OBS), torch.rand(7, ACT) * 2 - 1
    mean, std = ensemble.predict(obs, action)
    assert mean.shape == std.shape == (5, 7, OBS + 1)
    assert (std / ensemble.target_std <= torch.exp(torch.tensor(-0.5)) + 1e-6).all()
    model = DynamicsModel(ensemble, "none", elites=[3, 1])
    step = model(TensorDict({"observation": torch.randn(2, 6, OBS),
                             "action": torch.zeros(2, 6, ACT)}, [2, 6]))  # fmt: skip
    assert step["next", "observation"].shape == (2, 6, OBS)
    assert step["next", "reward"].shape == (2, 6, 1)
    loaded = load_dynamics(save_dynamics(model, tmp_path / "model.pt"))
    assert loaded.ensemble.shared_logvar_bounds and loaded.ensemble.max_logvar.shape[0] == 1
    arch = GaussianEnsemble(OBS, ACT, num_members=2, hidden_sizes=(8,)).architecture()
    assert "shared_logvar_bounds" not in arch  # the files written before the option load as before


def test_a_shared_parameter_takes_the_snapshot_when_any_member_improved() -> None:
    ensemble = GaussianEnsemble(OBS, ACT, num_members=3, hidden_sizes=(8,),
                                shared_logvar_bounds=True)  # fmt: skip
    best = {name: torch.zeros_like(param) for name, param in ensemble.named_parameters()}
    _update_snapshots(best, ensemble, torch.tensor([False, True, False]))
    assert torch.equal(best["max_logvar"], ensemble.max_logvar.detach())
    weight = next(name for name in best if name.endswith("weight"))
    assert (best[weight][0] == 0).all() and (best[weight][2] == 0).all()
    assert torch.equal(best[weight][1], dict(ensemble.named_parameters())[weight][1].detach())
    best = {name: torch.zeros_like(param) for name, param in ensemble.named_parameters()}
    _update_snapshots(best, ensemble, torch.tensor([False, False, False]))
    assert (best["max_logvar"] == 0).all()


def epoch_draws(redraw: bool, epochs: int = 2) -> list[torch.Tensor]:
    """The ``[E, N]`` row indices each of ``epochs`` epochs of :func:`train_epoch` visits."""
    config = DynamicsConfig(num_members=3, num_elites=2, batch_size=10, bootstrap_per_epoch=redraw)
    bootstrap = torch.randint(40, (3, 40), generator=torch.Generator().manual_seed(0))
    seen: list[torch.Tensor] = []

    def step(batch: TensorDict) -> TensorDict:
        seen.append(batch["index"])
        return TensorDict({"nll": torch.zeros(())}, [])

    generator = torch.Generator().manual_seed(1)
    draws = []
    for _ in range(epochs):
        seen.clear()
        train_epoch(step, bootstrap, generator, config)
        draws.append(torch.cat(seen, dim=1))
    return draws


def test_the_bootstrap_redrawn_every_epoch_changes_each_members_rows() -> None:
    def counts(draw: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.bincount(row, minlength=40) for row in draw])

    kept = epoch_draws(redraw=False)
    assert torch.equal(counts(kept[0]), counts(kept[1]))  # one resample, reshuffled
    assert not torch.equal(kept[0], kept[1])
    redrawn = epoch_draws(redraw=True)
    assert redrawn[0].shape == (3, 40)
    assert not torch.equal(counts(redrawn[0]), counts(redrawn[1]))  # a new resample


def linear_data(rows: int) -> TensorDict:
    generator = torch.Generator().manual_seed(3)
    obs = torch.randn(rows, OBS, generator=generator)
    action = torch.rand(rows, ACT, generator=generator) * 2 - 1
    delta = obs @ torch.full((OBS, OBS), 0.1) + action.sum(-1, keepdim=True) * 0.2
    reward = obs.sum(-1, keepdim=True) * 0.5 + 0.01 * torch.randn(rows, 1, generator=generator)
    return TensorDict({"observation": obs, "action": action,
                       "next": {"observation": obs + delta, "reward": reward},
                       "dynamics_mask": torch.ones(rows, dtype=torch.bool)}, [rows])  # fmt: skip


def test_the_authors_dynamics_train_with_a_separate_relu_reward_ensemble() -> None:
    config = DynamicsConfig(
        num_members=3, num_elites=2, hidden_size=32, num_layers=2, activation="relu",
        weight_decay=(0.0, 0.0, 0.0), separate_reward=True, shared_logvar_bounds=True,
        bootstrap_per_epoch=True, batch_size=64, max_holdout=100, max_epochs=20, lr=3e-3,
    )  # fmt: skip
    model, metrics = train_dynamics(linear_data(800), "none", config, progress=False)
    ensemble = model.ensemble
    assert isinstance(ensemble.net.activation, torch.nn.ReLU)
    assert isinstance(ensemble.reward_net.activation, torch.nn.ReLU)
    assert ensemble.net.layers[-1].weight.shape[-1] == 2 * OBS  # the state delta only
    assert ensemble.reward_net.layers[-1].weight.shape[-1] == 2  # the reward's mean, logvar
    assert ensemble.max_logvar.shape == (1, 1, OBS + 1)
    assert metrics["num_holdout"] == 100 and metrics["holdout_r2_per_dim"][-1] > 0.9
    obs = torch.randn(2, 5, OBS)
    next_obs, reward = model.predict_next(obs, torch.zeros(2, 5, ACT), mode="mean")
    assert next_obs.shape == (2, 5, OBS) and reward.shape == (2, 5, 1)
    torch.testing.assert_close(reward, obs.sum(-1, keepdim=True) * 0.5, atol=0.3, rtol=0)


def bc_data(rows: int) -> TensorDict:
    obs = torch.randn(rows, OBS, generator=torch.Generator().manual_seed(5))
    return TensorDict({"observation": obs, "action": torch.tanh(obs[:, :ACT])}, [rows])


def test_bc_fitted_to_held_out_convergence_keeps_its_best_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = bc_data(600)
    loss = BehaviourCloningLoss(make_actor(OBS, ACT, (32, 32)))
    config = BCConfig(converge=True, lr=3e-3, batch_size=64, max_epochs=30, patience=3,
                      holdout=100)  # fmt: skip
    logged: dict[str, float] = {}
    generator = torch.Generator().manual_seed(0)
    start = bc_holdout_nll(loss, data)
    epochs = fit_bc_to_convergence(
        loss, data, config, generator, tmp_path, lambda values, step: logged.update(values)
    )
    assert 1 <= epochs <= 30 and logged["bc/epochs"] == epochs
    assert logged["bc/holdout_nll"] < start - 1.0
    # The same draws give the same held-out rows: the restored weights score the best NLL.
    order = torch.randperm(600, generator=torch.Generator().manual_seed(0))
    assert bc_holdout_nll(loss, data[order[:100]]) == pytest.approx(logged["bc/holdout_nll"])


def test_bc_converge_is_a_cache_entry_of_its_own_and_off_keeps_the_old_key() -> None:
    assert BCConfig().cache_fields() == vars(PretrainConfig())
    assert BCConfig(converge=True).cache_fields()["converge"] is True
    data = bc_data(300)
    config = BCConfig(converge=True, batch_size=64, max_epochs=2, holdout=50)
    first, cached = load_or_train_bc(data, "fp", OBS, ACT, [16], config, 0, progress=False)
    again, cached_again = load_or_train_bc(data, "fp", OBS, ACT, [16], config, 0, progress=False)
    assert not cached and cached_again
    assert all(torch.equal(first[key], again[key]) for key in first)


def fqe_data(rows: int) -> TensorDict:
    generator = torch.Generator().manual_seed(2)
    obs = torch.randn(rows, OBS, generator=generator)
    terminated = torch.arange(rows) % 2 == 0
    return TensorDict({
        "observation": obs, "action": torch.tanh(obs[:, :ACT]),
        "next": {"observation": obs.roll(1, 0), "action": torch.tanh(obs.roll(1, 0)[:, :ACT]),
                 "reward": terminated.float().unsqueeze(-1) * 10.0,
                 "terminated": terminated.unsqueeze(-1)},
        "next_action_mask": torch.ones(rows, dtype=torch.bool),
    }, [rows])  # fmt: skip


@pytest.mark.parametrize("drop", [False, True])
def test_fqe_without_terminal_rows_fits_none_of_them(drop: bool) -> None:
    """Reward 10 on the terminal rows only: the first round's mean target shows which rows
    are fitted (about 5 with them, about 0 without)."""
    config = FQEConfig(converge=True, rounds=1, batch_size=64, max_epochs=1, holdout=20,
                       drop_terminal=drop)  # fmt: skip
    logged: dict[str, float] = {}
    load_or_train_fqe(fqe_data(200), "fp", OBS, ACT, [16], 2, 0.9, config, 0, progress=False,
                      log_fn=lambda values, step: logged.update(values))  # fmt: skip
    target = logged["fqe/target_mean"]
    assert (abs(target) < 1.0) if drop else (4.0 < target < 6.0)


def test_fqe_drop_terminal_off_keeps_the_old_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import cbop_torchrl.trainers.pretrain as pretrain

    keys: list[dict] = []
    monkeypatch.setattr(pretrain, "_stage_dir", lambda stage, key: keys.append(key) or 1 / 0)
    for config in (FQEConfig(), FQEConfig(drop_terminal=True)):
        with pytest.raises(ZeroDivisionError):
            load_or_train_fqe(fqe_data(20), "fp", OBS, ACT, [8], 2, 0.9, config, 0, False)
    assert "drop_terminal" not in keys[0]["config"] and keys[1]["config"]["drop_terminal"]


def test_the_estimators_unbiased_lcb_is_sqrt_mk_over_mk_minus_1_wider() -> None:
    """The posterior's variance scales by f = MK / (MK - 1) and its mean not at all, so the
    target's distance below the posterior mean grows by sqrt(f)."""
    import dataclasses

    from benchmarks.speed.models import build_models
    from benchmarks.speed.sizes import cpu_preset_size
    from cbop_torchrl.objectives.estimator import CBOPValueEstimator

    size = dataclasses.replace(cpu_preset_size(), batch=32)
    actor, qnets, dynamics, batch = build_models(size, torch.device("cpu"))
    common = {"horizon": size.horizon, "psi": 2.0, "alpha": 0.2, "seed": 0}

    def target(**options) -> torch.Tensor:
        estimator = CBOPValueEstimator(
            actor_network=actor, qvalue_network=qnets, dynamics=dynamics, **common, **options
        )
        return estimator.compute_target(batch.clone())[0]

    mean, lcb = target(mode="map"), target()
    unbiased = target(unbiased_variance=True)
    factor = size.members * size.particles / (size.members * size.particles - 1)
    assert not torch.equal(unbiased, lcb)
    torch.testing.assert_close(unbiased - mean, (lcb - mean) * factor**0.5, rtol=1e-4, atol=1e-4)
