"""Randomised prior members (``agent.critic_prior_scale``, beyond the paper): f_m + beta * p_m.

The module's maths, the unchanged default, per-member priors, and the priors' path through
TorchRL's functional parameters: stacked into ``qvalue_network_params`` and
``target_qvalue_network_params`` as buffers, untouched by the optimizer and the target
updates, run by ``vmap`` (not the fused plain-MLP path), trained by FQE and loaded into CBOP.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from test_cbop import ACT, GAMMA, OBS, CounterDynamics, make_batch
from test_config import load
from test_critic_layer_norm import fqe_cache_key
from torch import nn
from torchrl.modules import MLP
from torchrl.objectives import SoftUpdate

from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.accel.fused_mlp import plain_mlp_plan
from cbop_torchrl.config import ConfigError, FQEConfig, PretrainConfig
from cbop_torchrl.modules.actor_critic import (
    RandomizedPriorQ,
    action_spec,
    authors_q_init,
    make_actor,
    make_qvalue,
    make_qvalue_ensemble,
)
from cbop_torchrl.objectives.pretrain import ROW_KEY, FittedQEvaluationLoss, bootstrap_counts
from cbop_torchrl.trainers.offline import make_optimizer
from cbop_torchrl.trainers.pretrain import _sampler, fqe_target_update, run_supervised_stage
from cbop_torchrl.trainers.update import GradientStep

HIDDEN = (16, 12)
KEYS = ("observation", "action", "state_action_value")

pytestmark = [
    pytest.mark.filterwarnings("ignore:No target network updater"),
    pytest.mark.usefixtures("one_torch_thread"),
]


def by_hand(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP's layers applied one by one from their tensors (Linear, LayerNorm, ReLU)."""
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            x = x @ layer.weight.T + layer.bias
        elif isinstance(layer, nn.LayerNorm):
            x = nn.functional.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias)
        else:
            assert isinstance(layer, nn.ReLU)
            x = x.clamp_min(0)
    return x


def prior_of(net) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in net.module.prior.named_buffers()}


@pytest.mark.parametrize(("init", "layer_norm"), [("torch", False), ("authors", True)])
def test_output_is_the_trainable_net_plus_beta_times_the_frozen_prior(init, layer_norm):
    torch.manual_seed(0)
    net = make_qvalue(OBS, ACT, HIDDEN, init=init, layer_norm=layer_norm, prior_scale=2.5)
    module = net.module
    assert isinstance(module, RandomizedPriorQ) and module.prior_scale == 2.5
    assert list(net.in_keys) == ["observation", "action"]
    assert list(net.out_keys) == ["state_action_value"]
    # The same architecture (and init) for both parts; the prior's tensors are buffers.
    assert [type(m) for m in module.prior] == [type(m) for m in module.trainable]
    assert {name.split(".", 1)[0] for name, _ in module.named_parameters()} == {"trainable"}
    buffers = dict(module.named_buffers())
    assert set(buffers) == {f"prior.{name}" for name, _ in module.trainable.named_parameters()}
    assert not any(value.requires_grad for value in buffers.values())
    if init == "authors":  # hidden biases 0.1 in the prior too
        assert torch.all(module.prior[0].bias == 0.1)
    if layer_norm:  # a non-identity affine, so the prior's LayerNorm shows in the output
        with torch.no_grad():
            for layer in (*module.prior, *module.trainable):
                if isinstance(layer, nn.LayerNorm):
                    layer.weight.uniform_(0.5, 1.5)
                    layer.bias.uniform_(-0.5, 0.5)

    obs, action = torch.randn(3, 7, OBS), torch.rand(3, 7, ACT) * 2 - 1
    q = net(TensorDict({"observation": obs, "action": action}, [3, 7]))["state_action_value"]
    x = torch.cat([obs, action], dim=-1)
    f, p = by_hand(module.trainable, x), by_hand(module.prior, x)
    assert q.shape == (3, 7, 1) and p.abs().max() > 1e-3
    torch.testing.assert_close(q, f + 2.5 * p)

    # The prior gets no gradient; the trainable part does.
    q.sum().backward()
    assert all(param.grad is not None for param in module.trainable.parameters())
    assert all(buffer.grad is None for buffer in module.prior.buffers())


@pytest.mark.parametrize("init", ["torch", "authors"])
def test_prior_scale_zero_builds_the_current_network(init: str) -> None:
    torch.manual_seed(3)
    expected = MLP(
        in_features=OBS + ACT, out_features=1, num_cells=list(HIDDEN), activation_class=nn.ReLU
    )
    if init == "authors":
        authors_q_init(expected)
    after_expected = torch.get_rng_state()
    torch.manual_seed(3)
    plain = make_qvalue(OBS, ACT, HIDDEN, init=init, prior_scale=0.0)
    assert type(plain.module) is MLP and not list(plain.module.buffers())
    assert list(plain.state_dict()) == [f"module.{name}" for name in expected.state_dict()]
    torch.testing.assert_close(plain.module.state_dict(), expected.state_dict(), rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), after_expected)

    # With a prior, the trainable part is drawn first: the same weights as without.
    torch.manual_seed(3)
    with_prior = make_qvalue(OBS, ACT, HIDDEN, init=init, prior_scale=1.0)
    torch.testing.assert_close(
        with_prior.module.trainable.state_dict(), expected.state_dict(), rtol=0, atol=0
    )


def test_ensemble_priors_differ_per_member_follow_the_seed_and_leave_the_global_stream():
    torch.manual_seed(0)
    plain = make_qvalue_ensemble(3, OBS, ACT, HIDDEN)
    after_plain = torch.get_rng_state()
    torch.manual_seed(0)
    priors = make_qvalue_ensemble(3, OBS, ACT, HIDDEN, prior_scale=1.0, prior_seed=11)
    # The global generator is untouched by the priors: every member's trainable part (and
    # every later draw) is that of the paper's ensemble.
    assert torch.equal(torch.get_rng_state(), after_plain)
    for net, reference in zip(priors, plain, strict=True):
        torch.testing.assert_close(
            net.module.trainable.state_dict(), reference.module.state_dict(), rtol=0, atol=0
        )
    members = [prior_of(net) for net in priors]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.equal(members[i]["0.weight"], members[j]["0.weight"])
    # The same seed gives the same priors, another seed others.
    again = make_qvalue_ensemble(3, OBS, ACT, HIDDEN, prior_scale=1.0, prior_seed=11)
    other = make_qvalue_ensemble(3, OBS, ACT, HIDDEN, prior_scale=1.0, prior_seed=12)
    for m in range(3):
        torch.testing.assert_close(prior_of(again[m]), members[m], rtol=0, atol=0)
        assert not torch.equal(prior_of(other[m])["0.weight"], members[m]["0.weight"])


def prior_networks(M: int = 3, prior_scale: float = 1.0, prior_seed: int = 5) -> tuple:
    """The actor and M Q-networks of :func:`prior_cbop_loss`."""
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, hidden_sizes=(16,))
    qvalues = make_qvalue_ensemble(
        M, OBS, ACT, hidden_sizes=(16,), prior_scale=prior_scale, prior_seed=prior_seed
    )
    return actor, qvalues


def prior_cbop_loss(M: int = 3, prior_scale: float = 1.0, prior_seed: int = 5) -> CBOPLoss:
    """A tiny CBOP loss (as tests/test_cbop.py's) whose Q-members have priors."""
    actor, qvalues = prior_networks(M, prior_scale, prior_seed)
    return CBOPLoss(
        actor, qvalues, CounterDynamics(3), action_spec=action_spec(ACT), gamma=GAMMA,
        horizon=3, psi=1.0, seed=0,
    )  # fmt: skip


PRIOR_KEYS = [
    ("module", "prior", layer, part) for layer in ("0", "2") for part in ("weight", "bias")
]


def test_priors_ride_in_the_stacked_params_untouched_by_optimizer_and_target_updates():
    _, qnets = prior_networks()  # the loss's members, built alike
    loss = prior_cbop_loss()
    # (a) SACLoss stacks the members' buffers with their parameters, online and target alike,
    # each member's own values in its slice; they are buffers, not parameters of the loss.
    params, targets = loss.qvalue_network_params, loss.target_qvalue_network_params
    originals = {}
    for key in PRIOR_KEYS:
        stacked = torch.stack([net.module.get_buffer(".".join(key[1:])) for net in qnets])
        originals[key] = stacked
        torch.testing.assert_close(params.get(key), stacked, rtol=0, atol=0)
        torch.testing.assert_close(targets.get(key), stacked, rtol=0, atol=0)
        assert params.get(key).data_ptr() != targets.get(key).data_ptr()
        assert not params.get(key).requires_grad
    assert not any("prior" in name for name, _ in loss.named_parameters())
    prior_entries = [name for name in loss.state_dict() if ".prior." in name]
    assert len(prior_entries) == 2 * len(PRIOR_KEYS)  # online and target

    # (d) Not a plain MLP: the loss and the estimator take the vmap route, which runs each
    # member with its own prior: the stacked Q equals each member's module.
    assert plain_mlp_plan(loss.qvalue_network, *KEYS) is None
    assert loss._q_plan is None and loss.value_estimator._mlp_plan is None
    batch = make_batch(shape=(6,))
    with torch.no_grad():
        stacked_q = loss._member_q(batch, batch["action"], params, detach=True)
        member_q = torch.stack([net(batch.clone())["state_action_value"] for net in qnets])
    torch.testing.assert_close(stacked_q, member_q.squeeze(-1))

    # (b), (c): the run's optimizer (make_optimizer) and a Polyak target update inside the
    # run's GradientStep, over a few steps: the trainable parts move, the priors do not.
    agent = SimpleNamespace(actor_lr=1e-2, critic_lr=1e-2, alpha_lr=1e-2)
    optimizer = make_optimizer(loss, SimpleNamespace(agent=agent))
    step = GradientStep(loss, optimizer, SoftUpdate(loss, tau=0.5))
    trainable_key = ("module", "trainable", "0", "weight")
    before = params.get(trainable_key).detach().clone()
    target_before = targets.get(trainable_key).clone()
    for seed in range(4):
        out = step(make_batch(shape=(8,), seed=seed))
        assert all(torch.isfinite(out[key]) for key in ("loss_qvalue", "loss_actor", "grad_norm"))
        assert all(params.get(key).grad is None for key in PRIOR_KEYS)
    assert not torch.equal(params.get(trainable_key), before)
    assert not torch.equal(targets.get(trainable_key), target_before)
    for key in PRIOR_KEYS:
        torch.testing.assert_close(params.get(key), originals[key], rtol=0, atol=0)
        torch.testing.assert_close(targets.get(key), originals[key], rtol=0, atol=0)


def test_the_prior_makes_the_cbop_target_and_losses_depend_on_it():
    losses = {scale: prior_cbop_loss(prior_scale=scale) for scale in (0.0, 3.0)}
    batch = make_batch(shape=(6,))
    outs = {scale: loss(batch.clone()) for scale, loss in losses.items()}
    for out in outs.values():
        assert all(torch.isfinite(out[key]) for key in ("loss_qvalue", "loss_actor", "loss_alpha"))
    # The same trainable parts (drawn first), so only the priors change the target.
    assert not torch.equal(outs[0.0]["loss_qvalue"], outs[3.0]["loss_qvalue"])


def fqe_transitions(n: int) -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(n, OBS, generator=generator)
    next_obs = torch.randn(n, OBS, generator=generator)
    return TensorDict(
        {
            "observation": obs,
            "action": torch.tanh(obs[:, :ACT]),
            ("next", "observation"): next_obs,
            ("next", "action"): torch.tanh(next_obs[:, :ACT]),
            ("next", "reward"): torch.ones(n, 1),
            ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
            ROW_KEY: torch.arange(n),
        },
        batch_size=[n],
    )


def test_fqe_trains_with_priors_and_its_state_loads_into_cbop(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = fqe_transitions(128)
    qnets = make_qvalue_ensemble(3, OBS, ACT, (16,), prior_scale=1.0, prior_seed=5)
    fqe = FittedQEvaluationLoss(qnets, gamma=0.5, bootstrap_weights=bootstrap_counts(3, 128))
    originals = {key: fqe.qvalue_network_params.get(key).clone() for key in PRIOR_KEYS}
    with torch.no_grad():
        before = fqe(data)["loss_qvalue"].item()
    buffer, generator = _sampler(data, 32, seed=0)
    config = FQEConfig(steps=60, batch_size=32, lr=3e-3, checkpoint_interval=1000)
    run_supervised_stage(
        "fqe", fqe, buffer, generator, PretrainConfig(steps=60, batch_size=32, lr=3e-3,
        checkpoint_interval=1000), tmp_path, False, after_step=fqe_target_update(fqe, config),
    )  # fmt: skip
    with torch.no_grad():
        after = fqe(data)["loss_qvalue"].item()
    assert after < before
    for key in PRIOR_KEYS:
        torch.testing.assert_close(
            fqe.qvalue_network_params.get(key), originals[key], rtol=0, atol=0
        )
        torch.testing.assert_close(
            fqe.target_qvalue_network_params.get(key), originals[key], rtol=0, atol=0
        )

    # As trainers/offline.py: FQE's state dict (online and target, priors included) loads
    # into the CBOP loss, even one built with other priors.
    state = {k: v.detach().clone() for k, v in fqe.state_dict().items()}
    cbop = prior_cbop_loss(prior_seed=99)
    assert not torch.equal(cbop.qvalue_network_params.get(PRIOR_KEYS[0]), originals[PRIOR_KEYS[0]])
    incompatible = cbop.load_state_dict(state, strict=False)
    assert not incompatible.unexpected_keys
    assert not [key for key in incompatible.missing_keys if "qvalue_network" in key]
    for name in ("qvalue_network_params", "target_qvalue_network_params"):
        for key, value in getattr(fqe, name).items(True, True):
            torch.testing.assert_close(getattr(cbop, name).get(key), value, rtol=0, atol=0)
    batch = make_batch(shape=(5,))
    with torch.no_grad():
        fqe_q = fqe.ensemble_q(batch, fqe.qvalue_network_params).squeeze(-1)
        cbop_q = cbop._member_q(batch, batch["action"], cbop.qvalue_network_params, detach=True)
    torch.testing.assert_close(cbop_q, fqe_q)


def test_fqe_cache_key_holds_the_prior_scale_only_when_on(monkeypatch) -> None:
    default = fqe_cache_key(monkeypatch)
    assert "prior_scale" not in default
    assert fqe_cache_key(monkeypatch, prior_scale=0.0) == default
    assert fqe_cache_key(monkeypatch, prior_scale=1.5) == {**default, "prior_scale": 1.5}
    assert fqe_cache_key(monkeypatch, prior_scale=1) == {**default, "prior_scale": 1.0}
    with_ln = fqe_cache_key(monkeypatch, layer_norm=True, prior_scale=2.0)
    assert with_ln == {**default, "layer_norm": True, "prior_scale": 2.0}


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_config_refuses_a_negative_or_non_finite_prior_scale(value: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as error:
        load(f"agent.critic_prior_scale={value}")
    message = str(error.value)
    if value == "-1":
        assert "agent.critic_prior_scale=-1.0 must be a number >= 0" in message
        assert "e.g. agent.critic_prior_scale=1.0" in message
    else:
        assert f"agent.critic_prior_scale={float(value)!r} is not" in message


def test_config_leaves_the_prior_scale_out_of_the_training_settings_when_off() -> None:
    plain, _ = load()
    assert plain.agent.critic_prior_scale == 0.0
    assert "critic_prior_scale" not in plain.training_dict()["agent"]
    opted_in, _ = load("agent.critic_prior_scale=1.0")
    assert opted_in.agent.critic_prior_scale == 1.0
    assert opted_in.training_dict()["agent"]["critic_prior_scale"] == 1.0


def test_make_qvalue_refuses_a_negative_prior_scale() -> None:
    with pytest.raises(ValueError, match="prior_scale must be a finite number >= 0"):
        make_qvalue(OBS, ACT, HIDDEN, prior_scale=-0.5)
