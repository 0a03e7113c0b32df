"""CBOPValueEstimator and CBOPLoss on tiny networks with known answers."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.modules import MLP, ValueOperator
from torchrl.objectives import SACLoss

from cbop_torchrl.accel import CBOPLoss, CBOPValueEstimator
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives import (
    fixed_weight_moments,
    fixed_weights,
    gaussian_posterior,
    pooled_quantile,
)
from cbop_torchrl.trainers.offline import make_optimizer
from cbop_torchrl.trainers.update import GradientStep

OBS, ACT, GAMMA = 4, 2, 0.9

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


class CounterDynamics(TensorDictModuleBase):
    """Deterministic toy model for batch ``[K, N]``: feature 0 counts steps.

    Particle k earns reward ``1 + k`` per step. Particle 0 terminates when the
    counter reaches ``terminate_at`` (never if None); the others never do.
    """

    in_keys = ["observation", "action"]
    out_keys = [("next", "observation"), ("next", "reward"), ("next", "terminated")]

    def __init__(self, num_elites: int, terminate_at: float | None = None) -> None:
        super().__init__()
        self.num_elites = num_elites
        self.terminate_at = terminate_at
        self.scale = nn.Parameter(torch.ones(()))  # so we can check it gets no gradient

    def forward(self, td):
        obs = td.get("observation")
        next_obs = obs + self.scale * torch.nn.functional.one_hot(
            torch.zeros((), dtype=torch.long), obs.shape[-1]
        ).to(obs)
        k = torch.arange(obs.shape[0], device=obs.device, dtype=obs.dtype)
        k = k.view(-1, *([1] * (obs.dim() - 1)))
        reward = (1.0 + k).expand(*obs.shape[:-1], 1)
        if self.terminate_at is None:
            terminated = torch.zeros(*obs.shape[:-1], 1, dtype=torch.bool)
        else:
            terminated = (next_obs[..., :1] >= self.terminate_at) & (k == 0)
        td.set(("next", "observation"), next_obs)
        td.set(("next", "reward"), reward)
        td.set(("next", "terminated"), terminated)
        return td


def constant_q_ensemble(constants: list[float]) -> list[ValueOperator]:
    """Q_m(s, a) = constants[m] everywhere."""
    members = []
    for c in constants:
        net = MLP(in_features=OBS + ACT, out_features=1, num_cells=[])
        with torch.no_grad():
            net[0].weight.zero_()
            net[0].bias.fill_(c)
        members.append(ValueOperator(net, in_keys=["observation", "action"]))
    return members


def make_batch(shape=(5,), seed=0, terminated=False) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    next_obs = torch.randn(*shape, OBS, generator=gen)
    next_obs[..., 0] = 0.0
    return TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=gen),
            "action": torch.rand(*shape, ACT, generator=gen) * 2 - 1,
            "next": {
                "observation": next_obs,
                "reward": torch.randn(*shape, 1, generator=gen),
                "terminated": torch.full((*shape, 1), terminated),
                "done": torch.full((*shape, 1), terminated),
            },
        },
        batch_size=shape,
    )


def toy_estimator(constants=(1.0, 2.0, 4.0), K=3, H=3, terminate_at=None, **kwargs):
    torch.manual_seed(0)
    return CBOPValueEstimator(
        actor_network=make_actor(OBS, ACT, hidden_sizes=(8,)),
        qvalue_network=constant_q_ensemble(list(constants)),
        dynamics=CounterDynamics(K, terminate_at),
        gamma=GAMMA,
        horizon=H,
        **kwargs,
    )


def expected_returns(constants, K, H, terminate_at=None):
    """Hand-computed R_h[k, m] for CounterDynamics + constant Q, as (H+1, K, M)."""
    out = torch.zeros(H + 1, K, len(constants), dtype=torch.float64)
    for k in range(K):
        for m, c in enumerate(constants):
            for h in range(H + 1):
                value, alive = 0.0, True
                for t in range(1, h + 1):
                    if alive:
                        value += GAMMA ** (t - 1) * (1 + k)
                        if k == 0 and terminate_at is not None and t >= terminate_at:
                            alive = False
                out[h, k, m] = value + (GAMMA**h * c if alive else 0.0)
    return out


def test_returns_match_hand_computation_without_termination():
    est = toy_estimator()
    returns, valid, log_prob = est.rollout_returns(make_batch().get(("next", "observation")))
    assert returns.shape == (5, 4, 3, 3) and valid.all() and log_prob.shape == (5,)
    ref = expected_returns([1.0, 2.0, 4.0], 3, 3).float()
    torch.testing.assert_close(returns, ref.expand(5, -1, -1, -1))


@pytest.mark.parametrize("termination", ["absorb", "zero_precision"])
def test_terminating_particle_is_absorbing(termination):
    est = toy_estimator(terminate_at=2, termination=termination)
    returns, valid, _ = est.rollout_returns(make_batch().get(("next", "observation")))
    ref = expected_returns([1.0, 2.0, 4.0], 3, 3, terminate_at=2).float()
    torch.testing.assert_close(returns, ref.expand(5, -1, -1, -1))
    # Particle 0 after its terminal step: only r_1 + gamma r_2, for every Q member.
    torch.testing.assert_close(returns[:, 2:, 0], torch.full((5, 2, 3), 1 + GAMMA))
    if termination == "absorb":
        assert valid.all()
    else:  # horizons from the terminating step on get zero precision
        assert valid[:, :2].all() and not valid[:, 2:].any()
        post = gaussian_posterior(returns, valid)
        assert torch.all(post.weights[:, 2:] == 0)


def test_zero_precision_changes_the_target():
    kw = dict(terminate_at=2, psi=1.0, seed=0)
    y_zero = toy_estimator(termination="zero_precision", **kw).value_estimate(make_batch())
    y_absorb = toy_estimator(termination="absorb", **kw).value_estimate(make_batch())
    assert not torch.allclose(y_zero, y_absorb)


def test_dataset_terminal_transition_gives_reward():
    est = toy_estimator(alpha=0.7, psi=2.0)
    batch = make_batch(terminated=True)
    torch.testing.assert_close(est.value_estimate(batch), batch.get(("next", "reward")))


def test_target_formula_lcb_map_and_psi_zero():
    batch = make_batch()
    reward = batch.get(("next", "reward")).squeeze(-1)
    constants = (1.0, 2.0, 4.0)
    post = gaussian_posterior(expected_returns(constants, 3, 3).float().expand(5, -1, -1, -1))
    targets = {}
    for mode, psi in [("lcb", 2.0), ("lcb", 0.0), ("map", 2.0)]:
        est = toy_estimator(constants, mode=mode, psi=psi, alpha=0.0)
        targets[mode, psi] = est.value_estimate(batch).squeeze(-1)
    sigma = post.var.sqrt()
    torch.testing.assert_close(targets["lcb", 2.0], reward + GAMMA * (post.mean - 2.0 * sigma))
    torch.testing.assert_close(targets["map", 2.0], reward + GAMMA * post.mean)
    torch.testing.assert_close(targets["lcb", 0.0], targets["map", 2.0])
    assert torch.all(targets["lcb", 2.0] < targets["map", 2.0])


def test_entropy_term_uses_log_prob_of_first_action():
    batch = make_batch()
    y0 = toy_estimator(alpha=0.0, seed=3).value_estimate(batch)
    y1 = toy_estimator(alpha=0.5, seed=3).value_estimate(batch)
    # y1 - y0 = -gamma * 0.5 * log pi(a'|s'): the same a' thanks to the shared seed.
    est = toy_estimator(seed=3)
    with est._rng_context(torch.device("cpu")):
        _, _, log_prob = est.rollout_returns(batch.get(("next", "observation")))
    torch.testing.assert_close((y1 - y0).squeeze(-1), -GAMMA * 0.5 * log_prob)


def test_fixed_and_quantile_modes():
    batch = make_batch()
    reward = batch.get(("next", "reward")).squeeze(-1)
    returns = expected_returns((1.0, 2.0, 4.0), 3, 3).float().expand(5, -1, -1, -1)
    est = toy_estimator(mode="fixed", fixed_weighting="lambda", lmbda=0.5, psi=1.5)
    mean, var = fixed_weight_moments(returns, fixed_weights(3, 0.5))
    torch.testing.assert_close(
        est.value_estimate(batch).squeeze(-1), reward + GAMMA * (mean - 1.5 * var.sqrt())
    )
    est = toy_estimator(mode="quantile", quantile=0.25)
    torch.testing.assert_close(
        est.value_estimate(batch).squeeze(-1), reward + GAMMA * pooled_quantile(returns, 0.25)
    )


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="mode must be one of"):
        toy_estimator(mode="steve")
    with pytest.raises(ValueError, match="termination must be one of"):
        toy_estimator(termination="cut")
    with pytest.raises(ValueError, match="rollout_dtype"):
        toy_estimator(rollout_dtype="float16")
    with pytest.raises(ValueError, match="num_particles"):
        CBOPValueEstimator(
            actor_network=make_actor(OBS, ACT, (8,)),
            qvalue_network=constant_q_ensemble([1.0, 2.0]),
            dynamics=nn.Identity(),
        )


def tiny_cbop_loss(dynamics=None, M=3, seed=0, **kwargs) -> CBOPLoss:
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, hidden_sizes=(16,))
    qvalues = make_qvalue_ensemble(M, OBS, ACT, hidden_sizes=(16,))
    return CBOPLoss(
        actor,
        qvalues,
        dynamics if dynamics is not None else CounterDynamics(3),
        action_spec=action_spec(ACT),
        gamma=GAMMA,
        horizon=3,
        psi=1.0,
        seed=seed,
        **kwargs,
    )


def test_batched_tensordicts_without_manual_reshape():
    loss = tiny_cbop_loss()
    batch = make_batch(shape=(2, 3))
    target = loss.value_estimator.value_estimate(batch)
    assert target.shape == (2, 3, 1)
    out = loss(batch)
    assert out["loss_qvalue"].shape == () and torch.isfinite(out["loss_qvalue"])
    assert out["cbop", "weights"].shape == (4,)
    torch.testing.assert_close(out["cbop", "weights"].sum(), torch.tensor(1.0))
    assert 0.0 <= out["cbop", "expected_horizon"] <= 3.0
    assert out["cbop", "value_var_share"].shape == (4,)


def test_critic_gradient_reaches_only_the_online_q_ensemble():
    dynamics = CounterDynamics(3)
    loss = tiny_cbop_loss(dynamics)
    out = loss(make_batch())
    out["loss_qvalue"].backward()
    assert dynamics.scale.grad is None
    assert all(p.grad is None for p in loss.actor_network_params.values(True, True))
    assert all(not p.requires_grad for p in loss.target_qvalue_network_params.values(True, True))
    grads = [p.grad for p in loss.qvalue_network_params.values(True, True)]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_state_dict_has_no_estimator_or_dynamics_entries():
    loss = tiny_cbop_loss()
    keys = set(loss.state_dict())
    assert not any("estimator" in k or "dynamics" in k for k in keys)
    n_params = sum(p.numel() for p in loss.parameters())
    plain = SACLoss(
        make_actor(OBS, ACT, (16,)),
        make_qvalue_ensemble(3, OBS, ACT, (16,)),
        num_qvalue_nets=3,
        action_spec=action_spec(ACT),
    )
    assert keys == set(plain.state_dict())
    assert n_params == sum(p.numel() for p in plain.parameters())


def test_deepcopy_rewires_the_estimator_to_the_copy():
    loss = tiny_cbop_loss()
    clone = copy.deepcopy(loss)
    assert clone.value_estimator.__dict__["_loss"] is clone
    batch = make_batch()
    with torch.no_grad():
        for p in clone.target_qvalue_network_params.values(True, True):
            p.add_(1.0)
    assert not torch.allclose(
        clone.value_estimator.value_estimate(batch), loss.value_estimator.value_estimate(batch)
    )


def edac_loop(loss: CBOPLoss, batch: TensorDict) -> torch.Tensor:
    """EDAC's definition with explicit pairs: 1/(M-1) sum_{i != j} cos(g_i, g_j), batch mean."""
    grads = []
    params = loss.qvalue_network_params
    M = loss.num_qvalue_nets
    for m in range(M):
        action = batch["action"].detach().requires_grad_()
        td = TensorDict({"observation": batch["observation"], "action": action}, batch.batch_size)
        with params[m].to_module(loss.qvalue_network):
            q = loss.qvalue_network(td)["state_action_value"].sum()
        grads.append(torch.autograd.grad(q, action, create_graph=True)[0])
    total = 0.0
    for i in range(M):
        for j in range(M):
            if i != j:
                total = total + nn.functional.cosine_similarity(grads[i], grads[j], dim=-1, eps=0)
    return (total / (M - 1)).mean()


def test_edac_penalty_matches_definition_and_finite_differences():
    torch.manual_seed(0)
    M = 3
    actor = make_actor(OBS, ACT, hidden_sizes=(8,)).double()
    qvalues = []
    for _ in range(M):
        net = MLP(OBS + ACT, 1, num_cells=[6], activation_class=nn.Tanh).double()
        qvalues.append(ValueOperator(net, in_keys=["observation", "action"]))
    loss = CBOPLoss(actor, qvalues, CounterDynamics(3), action_spec=action_spec(ACT), horizon=1)
    batch = make_batch(shape=(4,)).apply(lambda x: x.double() if x.is_floating_point() else x)

    penalty = loss.edac_penalty(batch).mean()
    torch.testing.assert_close(penalty, edac_loop(loss, batch))

    weight = loss.qvalue_network_params["module", "0", "weight"]
    (grad,) = torch.autograd.grad(penalty, weight)
    eps = 1e-6
    for index in [(0, 0, 0), (1, 2, 3), (2, 5, 5)]:
        with torch.no_grad():
            weight[index] += eps
            up = loss.edac_penalty(batch).mean()
            weight[index] -= 2 * eps
            down = loss.edac_penalty(batch).mean()
            weight[index] += eps
        torch.testing.assert_close(grad[index], (up - down) / (2 * eps), rtol=1e-5, atol=1e-8)


def test_eta_scales_the_critic_loss():
    batch = make_batch()
    out0 = tiny_cbop_loss(eta=0.0)(batch)
    out2 = tiny_cbop_loss(eta=2.0)(batch)
    torch.testing.assert_close(out0["loss_qvalue"], out0["qvalue_mse"])
    torch.testing.assert_close(out2["qvalue_mse"], out0["qvalue_mse"])
    torch.testing.assert_close(out2["loss_qvalue"], out2["qvalue_mse"] + 2.0 * out2["edac_penalty"])
    assert out2["edac_penalty"] != 0


def test_bc_weight_adds_the_actors_nll_of_the_data_actions():
    """``bc_weight`` (beyond the paper): loss_actor + w * mean(-log pi(a_data|s)), nothing else."""
    batch = make_batch()
    plain, loss = tiny_cbop_loss(), tiny_cbop_loss(bc_weight=3.0)
    torch.manual_seed(1)  # the same actor samples in both
    out0 = plain(batch)
    torch.manual_seed(1)
    out3 = loss(batch)
    assert "bc_nll" not in out0.keys()
    actor = loss.actor_network
    with loss.actor_network_params.to_module(actor):
        dist = actor.get_dist(batch.select("observation"))
    nll = -dist.log_prob(batch["action"].clamp(-1 + 1e-5, 1 - 1e-5)).mean()
    torch.testing.assert_close(out3["bc_nll"], nll)
    torch.testing.assert_close(out3["loss_actor"], out0["loss_actor"] + 3.0 * nll)
    torch.testing.assert_close(out3["loss_qvalue"], out0["loss_qvalue"])
    with pytest.raises(ValueError, match="bc_weight must be >= 0"):
        tiny_cbop_loss(bc_weight=-1.0)


def train_one_loss(loss, params, key: str, batch: TensorDict, steps: int) -> None:
    """``steps`` Adam steps (lr 1e-2, seed 0) of ``params`` on ``loss(batch)[key]`` alone."""
    optimizer = torch.optim.Adam(params.values(True, True), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(steps):
        out = loss(batch)
        optimizer.zero_grad()
        out[key].backward()
        optimizer.step()


def test_bc_weight_keeps_the_actor_near_the_data_actions():
    """Trained on the summed loss, the BC term raises the data actions' likelihood."""
    batch = make_batch(shape=(64,))
    start = -float(tiny_cbop_loss(bc_weight=1.0).behaviour_nll(batch).mean().detach())
    log_likelihood = {}
    for weight in (0.0, 50.0):
        loss = tiny_cbop_loss(bc_weight=weight)
        train_one_loss(loss, loss.actor_network_params, "loss_actor", batch, steps=30)
        with torch.no_grad():
            loss.bc_weight = 1.0
            log_likelihood[weight] = -float(loss.behaviour_nll(batch).mean())
    assert log_likelihood[50.0] > start + 0.25, (start, log_likelihood)
    assert log_likelihood[50.0] > log_likelihood[0.0] + 0.25, (start, log_likelihood)


def test_critic_penalty_adds_each_members_gap_between_policy_and_data_actions():
    """``critic_penalty`` (beyond the paper): loss_qvalue + c * sum_m [Q_m(s, a_pi) - Q_m(s, a)]."""
    batch = make_batch(shape=(6,))
    plain, loss = tiny_cbop_loss(), tiny_cbop_loss(critic_penalty=0.5)
    policy_action = torch.rand(6, ACT) * 2 - 1
    loss._policy_action = lambda tensordict: policy_action  # the draw, fixed for the check
    torch.manual_seed(1)
    out0 = plain(batch)
    torch.manual_seed(1)
    out = loss(batch)
    assert "critic_gap" not in out0.keys()
    gaps = []
    for member in range(3):
        with loss.qvalue_network_params[member].to_module(loss.qvalue_network):
            at_policy = loss.qvalue_network(batch.clone().set("action", policy_action))
            at_data = loss.qvalue_network(batch.clone())
            gaps.append(at_policy["state_action_value"] - at_data["state_action_value"])
    gap = torch.stack(gaps).squeeze(-1)  # [M, batch]
    torch.testing.assert_close(out["critic_gap"], gap.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        out["loss_qvalue"], out0["loss_qvalue"] + 0.5 * gap.sum(0).mean(), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(out["loss_actor"], out0["loss_actor"])
    with pytest.raises(ValueError, match="critic_penalty must be a finite number >= 0"):
        tiny_cbop_loss(critic_penalty=-1.0)


def test_critic_penalty_makes_q_fall_at_the_policys_actions():
    """Trained on loss_qvalue alone, a large penalty lowers Q(pi) - Q(data); without it, not."""
    batch = make_batch(shape=(64,))
    gaps = {}
    for weight in (0.0, 5.0):
        loss = tiny_cbop_loss(critic_penalty=weight)
        train_one_loss(loss, loss.qvalue_network_params, "loss_qvalue", batch, steps=40)
        measure = tiny_cbop_loss(critic_penalty=1.0)
        measure.load_state_dict(loss.state_dict())
        torch.manual_seed(2)
        gaps[weight] = float(measure(batch)["critic_gap"])
    assert gaps[5.0] < gaps[0.0] - 0.1, gaps
    assert gaps[5.0] < 0, gaps


def test_critic_lr_zero_freezes_the_critics_while_the_actor_and_alpha_learn():
    """``agent.critic_lr=0``, the frozen-critic control: the run's optimizer and step."""
    loss = tiny_cbop_loss()
    agent = SimpleNamespace(actor_lr=1e-2, critic_lr=0.0, alpha_lr=1e-2)
    step = GradientStep(loss, make_optimizer(loss, SimpleNamespace(agent=agent)))
    critics = loss.qvalue_network_params.clone()
    actor = loss.actor_network_params.clone()
    log_alpha = loss.log_alpha.detach().clone()
    for seed in range(3):
        out = step(make_batch(shape=(8,), seed=seed))
        assert out["loss_qvalue"] > 0  # the critics' loss is computed, its step is zero
    assert (loss.qvalue_network_params == critics).all()
    assert not (loss.actor_network_params == actor).all()
    assert not torch.equal(loss.log_alpha.detach(), log_alpha)


def test_stock_sac_loss_swap_gives_cbop_loss_targets():
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, hidden_sizes=(16,))
    qvalues = make_qvalue_ensemble(4, OBS, ACT, hidden_sizes=(16,))
    dynamics = CounterDynamics(3)
    settings = dict(gamma=GAMMA, horizon=3, psi=2.0, seed=11)

    sac = SACLoss(
        copy.deepcopy(actor),
        copy.deepcopy(qvalues),
        num_qvalue_nets=4,
        action_spec=action_spec(ACT),
        loss_function="l2",
    )
    keys_before = set(sac.state_dict())
    sac.make_value_estimator(CBOPValueEstimator.from_sac_loss(sac, dynamics, **settings))
    assert set(sac.state_dict()) == keys_before

    cbop = CBOPLoss(actor, qvalues, dynamics, action_spec=action_spec(ACT), eta=0.0, **settings)
    batch = make_batch(shape=(6,))
    # SACLoss first runs its own (discarded) bootstrap with the global RNG; the
    # estimator's private seed stream makes the targets identical regardless.
    torch.testing.assert_close(sac._compute_target_v2(batch), cbop._compute_target_v2(batch))
    out_sac, out_cbop = sac(batch), cbop(batch)
    torch.testing.assert_close(out_sac["loss_qvalue"], out_cbop["loss_qvalue"])


def test_bf16_rollout_is_close_to_fp32():
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, hidden_sizes=(32, 32))
    qvalues = make_qvalue_ensemble(4, OBS, ACT, hidden_sizes=(32, 32))
    batch = make_batch(shape=(64,))
    batch.set(("next", "reward"), torch.zeros(64, 1))  # std(y) is the value part's alone
    targets = {}
    for dtype in ("float32", "bfloat16"):
        est = CBOPValueEstimator(
            actor_network=actor,
            qvalue_network=qvalues,
            dynamics=CounterDynamics(3),
            gamma=GAMMA,
            horizon=3,
            psi=1.0,
            seed=5,
            rollout_dtype=dtype,
        )
        targets[dtype] = est.value_estimate(batch)
        assert targets[dtype].dtype == torch.float32
    diff = (targets["bfloat16"] - targets["float32"]).abs()
    assert diff.max() > 0  # the bf16 path really ran in reduced precision
    assert diff.mean() < 0.05 * targets["float32"].std()


def test_fused_q_path_matches_vmap():
    torch.manual_seed(0)
    qvalues = make_qvalue_ensemble(3, OBS, ACT, hidden_sizes=(16, 16))
    kwargs = dict(
        actor_network=make_actor(OBS, ACT, (8,)),
        qvalue_network=qvalues,
        dynamics=CounterDynamics(3),
        horizon=2,
    )
    fused = CBOPValueEstimator(**kwargs)
    generic = CBOPValueEstimator(**kwargs, fused_q=False)
    assert fused._mlp_plan is not None and generic._mlp_plan is None
    obs, action = torch.randn(7, OBS), torch.rand(7, ACT)
    params = fused._qvalue_params(None)
    torch.testing.assert_close(
        fused._q_values(obs, action, params), generic._q_values(obs, action, params)
    )
    # A network that is not a plain MLP falls back to vmap.
    odd = [ValueOperator(nn.Sequential(nn.Linear(OBS + ACT, 1)), in_keys=["action", "observation"])]
    assert CBOPValueEstimator(**{**kwargs, "qvalue_network": odd * 2})._mlp_plan is None


def test_with_the_real_dynamics_model():
    from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble

    obs_dim, act_dim = 11, 3  # hopper layout, so its termination function applies
    torch.manual_seed(0)
    ensemble = GaussianEnsemble(obs_dim, act_dim, num_members=4, hidden_sizes=(16, 16))
    dynamics = DynamicsModel(ensemble, "hopper", elites=[2, 0, 3])
    actor = make_actor(obs_dim, act_dim, (16,))
    qvalues = make_qvalue_ensemble(3, obs_dim, act_dim, (16,))
    gen = torch.Generator().manual_seed(0)
    next_obs = 0.05 * torch.randn(8, obs_dim, generator=gen)
    next_obs[:, 0] = 1.25  # a healthy hopper height
    batch = TensorDict(
        {
            "observation": next_obs.clone(),
            "action": torch.zeros(8, act_dim),
            "next": {
                "observation": next_obs,
                "reward": torch.ones(8, 1),
                "terminated": torch.zeros(8, 1, dtype=torch.bool),
                "done": torch.zeros(8, 1, dtype=torch.bool),
            },
        },
        batch_size=[8],
    )
    loss = CBOPLoss(actor, qvalues, dynamics, action_spec=action_spec(act_dim), horizon=4, seed=3)
    assert loss.value_estimator.num_particles == 3
    out = loss(batch)
    out["loss_qvalue"].backward()
    assert all(p.grad is None for p in ensemble.parameters())
    assert torch.isfinite(out["cbop", "target_mean"])

    # The private seed stream makes the stochastic model rollout reproducible.
    def target(seed):
        fresh = CBOPLoss(
            actor, qvalues, dynamics, action_spec=action_spec(act_dim), horizon=4, seed=seed
        )
        return fresh.value_estimator.value_estimate(batch)

    torch.testing.assert_close(target(3), target(3))
    assert not torch.allclose(target(3), target(4))


@pytest.mark.parametrize("terminate_at", [None, 2])
@pytest.mark.parametrize("termination", ["absorb", "zero_precision"])
def test_independent_sampling_equals_shared_for_a_deterministic_model(terminate_at, termination):
    """Same particles, same answer: only the randomness differs between the two schemes."""
    next_obs = make_batch().get(("next", "observation"))
    shared = toy_estimator(terminate_at=terminate_at, termination=termination)
    independent = toy_estimator(
        terminate_at=terminate_at, termination=termination, sampling="independent"
    )
    returns_shared, valid_shared, _ = shared.rollout_returns(next_obs)
    returns_indep, valid_indep, _ = independent.rollout_returns(next_obs)
    torch.testing.assert_close(returns_indep, returns_shared)
    assert torch.equal(valid_indep, valid_shared)


class NoisyRewardDynamics(TensorDictModuleBase):
    """The state never changes; every particle earns an independent N(0, 1) reward per step."""

    in_keys = ["observation", "action"]
    out_keys = [("next", "observation"), ("next", "reward"), ("next", "terminated")]

    def __init__(self, num_elites: int) -> None:
        super().__init__()
        self.num_elites = num_elites

    def forward(self, td):
        obs = td.get("observation")
        td.set(("next", "observation"), obs.clone())
        td.set(("next", "reward"), torch.randn(*obs.shape[:-1], 1))
        td.set(("next", "terminated"), torch.zeros(*obs.shape[:-1], 1, dtype=torch.bool))
        return td


@pytest.mark.parametrize(
    ("sampling", "expected"), [("shared", 1 / 1.81**0.5), ("independent", 0.0)]
)
def test_independent_sampling_decorrelates_the_horizons(sampling, expected):
    """R_1 = r_1 and R_2 = r_1 + 0.9 r_2 share r_1 only when the rollouts are shared."""
    K = 4000
    torch.manual_seed(0)
    est = CBOPValueEstimator(
        actor_network=make_actor(OBS, ACT, hidden_sizes=(8,)),
        qvalue_network=constant_q_ensemble([0.0, 0.0]),
        dynamics=NoisyRewardDynamics(K),
        gamma=GAMMA,
        horizon=2,
        sampling=sampling,
    )
    returns, _, _ = est.rollout_returns(torch.zeros(1, OBS))  # (1, 3, K, 2)
    r1, r2 = returns[0, 1, :, 0], returns[0, 2, :, 0]
    correlation = torch.corrcoef(torch.stack([r1, r2]))[0, 1]
    assert abs(float(correlation) - expected) < 0.05
    assert abs(float(r2.var()) - 1.81) < 0.15  # each horizon keeps its own variance


def test_unknown_sampling_is_refused():
    with pytest.raises(ValueError, match="sampling must be one of"):
        toy_estimator(sampling="paired")


class PoisonedAfterTermination(CounterDynamics):
    """CounterDynamics whose prediction from a terminal state is NaN (out of the model's range)."""

    def forward(self, td):
        obs = td.get("observation")
        k = torch.arange(obs.shape[0]).view(-1, *([1] * (obs.dim() - 1)))
        terminal = (obs[..., :1] >= self.terminate_at) & (k == 0)  # particle 0's end state
        td = super().forward(td)
        next_obs = td.get(("next", "observation"))
        td.set(("next", "observation"), torch.where(terminal, float("nan"), next_obs))
        return td


@pytest.mark.parametrize("sampling", ["shared", "independent"])
def test_a_non_finite_prediction_after_termination_leaves_the_target_finite(sampling):
    """Terminated particles are frozen at their last live state: the model never sees the
    terminal state, whose prediction here is NaN, and masked horizons stay out of the sums."""
    constants, K, H, terminate_at = [1.0, 2.0, 4.0], 3, 4, 2
    torch.manual_seed(0)
    est = CBOPValueEstimator(
        actor_network=make_actor(OBS, ACT, hidden_sizes=(8,)),
        qvalue_network=constant_q_ensemble(constants),
        dynamics=PoisonedAfterTermination(K, terminate_at),
        gamma=GAMMA,
        horizon=H,
        sampling=sampling,
    )
    batch = make_batch()
    returns, valid, _ = est.rollout_returns(batch.get(("next", "observation")))
    assert torch.isfinite(returns).all()
    ref = expected_returns(constants, K, H, terminate_at).float()
    torch.testing.assert_close(returns, ref.expand(5, -1, -1, -1))
    target, _ = est.compute_target(batch)
    assert torch.isfinite(target).all()
