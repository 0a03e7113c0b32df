"""Behaviour cloning and fitted Q evaluation: losses, bootstrap weights, resumable stages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import SoftUpdate

from cbop_torchrl.config import FQEConfig, PretrainConfig
from cbop_torchrl.modules.actor_critic import make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.diversity import gradient_diversity_penalty
from cbop_torchrl.objectives.pretrain import (
    ROW_KEY,
    BehaviourCloningLoss,
    FittedQEvaluationLoss,
    bootstrap_counts,
    member_action_gradients,
)
from cbop_torchrl.trainers.pretrain import (
    _sampler,
    fit_fqe_rounds_to_convergence,
    fqe_target_update,
    run_supervised_stage,
)

OBS, ACT = 4, 2


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def transitions(n: int, terminated: bool = False, seed: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, OBS, generator=generator)
    action = torch.tanh(obs[:, :ACT] * 1.5)  # a deterministic behaviour policy
    next_obs = torch.randn(n, OBS, generator=generator)
    return TensorDict(
        {
            "observation": obs,
            "action": action,
            ("next", "observation"): next_obs,
            ("next", "action"): torch.tanh(next_obs[:, :ACT] * 1.5),
            ("next", "reward"): torch.ones(n, 1),
            ("next", "terminated"): torch.full((n, 1), terminated),
            ROW_KEY: torch.arange(n),
        },
        batch_size=[n],
    )


def test_behaviour_cloning_fits_the_dataset_actions(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = transitions(512)
    actor = make_actor(OBS, ACT, (32, 32))
    loss = BehaviourCloningLoss(actor)
    before = float(loss(data)["log_prob"])
    buffer, generator = _sampler(data, 128, seed=0)
    config = PretrainConfig(steps=300, batch_size=128, lr=3e-3, checkpoint_interval=1000)
    run_supervised_stage("bc", loss, buffer, generator, config, tmp_path, progress=False)
    after = float(loss(data)["log_prob"])
    assert after > before + 2.0
    mean_action = actor.get_dist(data.select("observation")).deterministic_sample
    assert (mean_action - data["action"]).abs().mean() < 0.1


def test_fqe_target_and_bootstrap_weighted_loss_match_the_definition() -> None:
    torch.manual_seed(0)
    data = transitions(6)
    data["next", "terminated"][3] = True
    weights = torch.tensor([[1, 0, 2, 1, 0, 2], [0, 3, 0, 1, 1, 1]], dtype=torch.uint8)
    loss = FittedQEvaluationLoss(make_qvalue_ensemble(2, OBS, ACT, (8,)), 0.9, weights)
    next_td = TensorDict(
        {"observation": data["next", "observation"], "action": data["next", "action"]}, [6]
    )
    with torch.no_grad():
        next_q = loss.ensemble_q(next_td, loss.target_qvalue_network_params).mean(0)
        q = loss.ensemble_q(data, loss.qvalue_network_params)
    target = 1.0 + 0.9 * (~data["next", "terminated"]).float() * next_q
    assert target[3].item() == 1.0  # a terminal transition does not bootstrap
    w = weights.float()
    expected = ((w * (q - target).pow(2).squeeze(-1)).sum(-1) / w.sum(-1)).sum()
    assert torch.allclose(loss(data)["loss_qvalue"], expected, rtol=1e-5)


@pytest.mark.parametrize(("terminated", "value"), [(False, 2.0), (True, 1.0)])
def test_fqe_converges_to_the_behaviour_value(tmp_path: Path, terminated: bool, value: float):
    """Reward 1 at every step: Q = 1 / (1 - gamma) = 2 with gamma 0.5, or 1 if terminal."""
    torch.manual_seed(0)
    data = transitions(256, terminated=terminated)
    qnets = make_qvalue_ensemble(2, OBS, ACT, (32, 32))
    loss = FittedQEvaluationLoss(qnets, gamma=0.5, bootstrap_weights=bootstrap_counts(2, 256))
    updater = SoftUpdate(loss, tau=0.2)
    buffer, generator = _sampler(data, 64, seed=0)
    config = PretrainConfig(steps=250, batch_size=64, lr=3e-3, checkpoint_interval=1000)
    run_supervised_stage(
        "fqe", loss, buffer, generator, config, tmp_path, False,
        after_step=lambda step: updater.step(),
    )  # fmt: skip
    with torch.no_grad():
        q = loss.ensemble_q(data, loss.qvalue_network_params)
    assert abs(q.mean().item() - value) < 0.1


def test_bootstrap_counts_are_per_member_resamples() -> None:
    counts = bootstrap_counts(3, 1000, torch.Generator().manual_seed(0))
    assert counts.shape == (3, 1000) and counts.dtype == torch.uint8
    assert (counts.long().sum(-1) == 1000).all()
    left_out = (counts == 0).float().mean(-1)  # about e^-1 of the rows per member
    assert ((left_out > 0.32) & (left_out < 0.42)).all()
    assert not torch.equal(counts[0], counts[1])


def test_interrupted_stage_resumes_to_the_same_parameters(tmp_path: Path) -> None:
    data = transitions(256)
    config = PretrainConfig(steps=30, batch_size=32, lr=1e-3, checkpoint_interval=10)

    def stage(work_dir: Path, stop_at: int | None = None) -> BehaviourCloningLoss:
        torch.manual_seed(1)
        loss = BehaviourCloningLoss(make_actor(OBS, ACT, (16,)))
        buffer, generator = _sampler(data, config.batch_size, seed=3)
        count = {"steps": 0}

        def after_step(step: int) -> None:
            count["steps"] += 1
            if count["steps"] == stop_at:
                raise KeyboardInterrupt

        try:
            run_supervised_stage("bc", loss, buffer, generator, config, work_dir, False,
                                 after_step=after_step)  # fmt: skip
        except KeyboardInterrupt:
            pass
        return loss

    reference = stage(tmp_path / "a")
    stage(tmp_path / "b", stop_at=25)  # killed after step 25; its checkpoint is at step 20
    assert torch.load(tmp_path / "b" / "partial.pt", weights_only=True)["step"] == 20
    resumed = stage(tmp_path / "b")
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_fqe_rounds_give_the_few_step_value(tmp_path: Path) -> None:
    """Two hard-target rounds, reward 1, gamma 0.5, from Q = 0: Q -> 1 + 0.5 * 1 = 1.5, not 2."""
    torch.manual_seed(0)
    data = transitions(256)
    qnets = make_qvalue_ensemble(2, OBS, ACT, (32, 32))
    with torch.no_grad():  # Q = 0 everywhere, so round 1 regresses on r alone
        for net in qnets:
            net.module[-1].weight.zero_()
            net.module[-1].bias.zero_()
    loss = FittedQEvaluationLoss(qnets, gamma=0.5)
    config = FQEConfig(steps=600, batch_size=64, lr=3e-3, checkpoint_interval=1000, rounds=2)
    buffer, generator = _sampler(data, 64, seed=0)
    run_supervised_stage(
        "fqe", loss, buffer, generator, config, tmp_path, False,
        after_step=fqe_target_update(loss, config),
    )  # fmt: skip
    with torch.no_grad():
        q = loss.ensemble_q(data, loss.qvalue_network_params)
    assert abs(q.mean().item() - 1.5) < 0.1


def test_gradient_diversity_penalty_extremes() -> None:
    same = torch.tensor([1.0, 2.0]).expand(4, 3, 2)
    assert torch.allclose(gradient_diversity_penalty(same), torch.full((3,), 4.0))  # M
    orthogonal = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).unsqueeze(1)  # M = 2, batch 1
    assert torch.allclose(gradient_diversity_penalty(orthogonal), torch.zeros(1), atol=1e-6)


def test_fqe_diversity_term_matches_cbop_loss_and_decorrelates_members(tmp_path: Path) -> None:
    from cbop_torchrl.modules.actor_critic import action_spec
    from cbop_torchrl.objectives.loss import CBOPLoss

    torch.manual_seed(0)
    data = transitions(256)
    qnets = make_qvalue_ensemble(3, OBS, ACT, (32, 32))
    loss = FittedQEvaluationLoss(qnets, gamma=0.5, eta=1.0)
    grad = member_action_gradients(loss.qvalue_network, loss.qvalue_network_params, data)
    cbop = CBOPLoss(
        make_actor(OBS, ACT, (8,)), qnets, dynamics=None, action_spec=action_spec(ACT),
        horizon=0, estimator_kwargs={"num_particles": 1},
    )  # fmt: skip
    cbop.load_state_dict(loss.state_dict(), strict=False)
    torch.testing.assert_close(gradient_diversity_penalty(grad), cbop.edac_penalty(data))

    def final_penalty(eta: float) -> float:
        torch.manual_seed(0)
        loss = FittedQEvaluationLoss(make_qvalue_ensemble(3, OBS, ACT, (32, 32)), 0.5, eta=eta)
        config = FQEConfig(steps=300, batch_size=64, lr=3e-3, checkpoint_interval=1000)
        buffer, generator = _sampler(data, 64, seed=0)
        run_supervised_stage(
            "fqe", loss, buffer, generator, config, tmp_path / str(eta), False,
            after_step=fqe_target_update(loss, config),
        )  # fmt: skip
        grad = member_action_gradients(loss.qvalue_network, loss.qvalue_network_params, data)
        return float(gradient_diversity_penalty(grad).mean())

    assert final_penalty(1.0) < final_penalty(0.0) - 0.3


def converged_fqe(work_dir: Path, rounds: int, init: str = "authors") -> FittedQEvaluationLoss:
    torch.manual_seed(0)
    qnets = make_qvalue_ensemble(3, OBS, ACT, (32, 32), init=init)
    loss = FittedQEvaluationLoss(qnets, gamma=0.5)
    config = FQEConfig(
        batch_size=64, lr=3e-3, rounds=rounds, converge=True, max_epochs=40, patience=3,
        holdout=100,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    fit_fqe_rounds_to_convergence(loss, transitions(400), config, generator, work_dir)
    return loss


def test_converged_fqe_rounds_reach_the_few_step_value_and_resume_per_round(
    tmp_path: Path,
) -> None:
    """The authors' FQE: each round fitted until held-out MSE stalls. From Q ~ 0 (their init:
    last layer +-3e-3, biases 0.1), reward 1 and gamma 0.5, round 1 fits Q ~ 1 + 0.5 Q_0 and
    round 2 Q ~ 1.5 + 0.25 Q_0: the few-step value, fitted closely in every member."""
    loss = converged_fqe(tmp_path / "a", rounds=2)
    data = transitions(400)
    with torch.no_grad():
        q = loss.ensemble_q(data, loss.qvalue_network_params).squeeze(-1)  # [M, N]
        target_q = loss.ensemble_q(data, loss.target_qvalue_network_params).squeeze(-1)
    assert q.mean().item() == pytest.approx(1.5, abs=0.1)
    assert (q.mean(-1) - 1.5).abs().max().item() < 0.15  # every member, not just the mean
    torch.testing.assert_close(q, target_q)  # the target copies the final round's weights
    # Stopped after round 1, then resumed: the same parameters as the uninterrupted stage.
    converged_fqe(tmp_path / "b", rounds=1)
    assert torch.load(tmp_path / "b" / "partial.pt", weights_only=True)["round"] == 1
    resumed = converged_fqe(tmp_path / "b", rounds=2)
    for key, value in loss.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_authors_q_init_starts_every_member_near_the_bias() -> None:
    torch.manual_seed(0)
    data = transitions(64)
    authors = FittedQEvaluationLoss(make_qvalue_ensemble(4, OBS, ACT, (32, 32), init="authors"))
    default = FittedQEvaluationLoss(make_qvalue_ensemble(4, OBS, ACT, (32, 32)))
    with torch.no_grad():
        q_authors = authors.ensemble_q(data, authors.qvalue_network_params)
        q_default = default.ensemble_q(data, default.qvalue_network_params)
    # Output layer +-3e-3 over 32 hidden units of about 0.1-1: |Q| well below 0.1.
    assert q_authors.abs().max().item() < 0.1
    assert q_default.abs().max().item() > 0.1
    with pytest.raises(ValueError, match="init='bogus'"):
        make_qvalue_ensemble(1, OBS, ACT, (8,), init="bogus")
