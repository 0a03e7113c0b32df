"""CQL's penalty scores the next state's actions where the authors' code does (at ``s``).

``AuthorsCQLLoss`` and stock ``torchrl.objectives.CQLLoss`` get the same networks, batch and
random draws; the critic inputs of their penalties are recorded. Uniform actions and the
policy's actions at ``s`` are scored at ``s`` by both; the policy's actions at ``s'`` are the
same actions in both, scored at ``s`` by AuthorsCQLLoss and at ``s'`` by CQLLoss."""

from __future__ import annotations

import pytest
import torch
from batches import random_transitions
from torchrl.objectives import CQLLoss

from cbop_torchrl.baselines import AlgoConfig, BaselineConfigError, build_baseline
from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.cql import AuthorsCQLLoss

OBS, ACT, ROWS, NUM_RANDOM, CRITICS = 4, 2, 6, 3, 2


def _loss(cls: type) -> CQLLoss:
    torch.manual_seed(0)
    loss = cls(
        make_actor(OBS, ACT, (8,)), make_qvalue_ensemble(CRITICS, OBS, ACT, (8,)),
        action_spec=action_spec(ACT), num_random=NUM_RANDOM, deterministic_backup=True,
    )  # fmt: skip
    loss.make_value_estimator(gamma=0.99)
    return loss


def _penalty_inputs(loss: CQLLoss, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The penalty, and the observations and actions its critics scored: [3, CRITICS, B*N, .]."""
    seen = {}
    scored = loss._vmap_qvalue_network00

    def record(td, params):
        seen["observation"] = td.get("observation").clone()
        seen["action"] = td.get("action").clone()
        return scored(td, params)

    loss._vmap_qvalue_network00 = record
    torch.manual_seed(5)
    td = batch.clone()
    loss.q_loss(td)
    penalty, _ = loss.cql_loss(td)
    shape = (3, CRITICS, ROWS * NUM_RANDOM, -1)  # random, at s, at s' (each for each critic)
    return penalty, seen["observation"].reshape(shape), seen["action"].reshape(shape)


def test_next_state_actions_are_scored_at_the_state_with_the_same_draws() -> None:
    batch = random_transitions((ROWS,), OBS, ACT)
    batch.set("action", batch.get("action").clamp(-0.9, 0.9))
    states = batch.get("observation").repeat_interleave(NUM_RANDOM, dim=0)  # [B*N, OBS]
    next_states = batch.get(("next", "observation")).repeat_interleave(NUM_RANDOM, dim=0)
    stock_penalty, stock_obs, stock_actions = _penalty_inputs(_loss(CQLLoss), batch)
    penalty, obs, actions = _penalty_inputs(_loss(AuthorsCQLLoss), batch)

    torch.testing.assert_close(actions, stock_actions, rtol=0, atol=0)  # the same draws
    for group in (0, 1):  # uniform actions, the policy's at s: both at s
        assert torch.equal(obs[group], stock_obs[group])
        assert torch.equal(obs[group], states.expand(CRITICS, -1, -1))
    assert torch.equal(stock_obs[2], next_states.expand(CRITICS, -1, -1))  # TorchRL: at s'
    assert torch.equal(obs[2], states.expand(CRITICS, -1, -1))  # the authors': at s
    assert not torch.allclose(penalty, stock_penalty)  # so the penalty itself differs


def test_the_cql_recipe_takes_the_authors_penalty_and_torchrls_is_an_option() -> None:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=OBS, action_dim=ACT)
    config = RunConfig()
    config.agent.hidden_sizes = [8]
    assert AlgoConfig(name="cql").next_actions_scored_at == "state"
    default = build_baseline(AlgoConfig(name="cql", hidden_sizes=[8]), config, info, "cpu")
    assert type(default.loss) is AuthorsCQLLoss
    torchrl = AlgoConfig(name="cql", hidden_sizes=[8], next_actions_scored_at="next_state")
    assert type(build_baseline(torchrl, config, info, "cpu").loss) is CQLLoss
    with pytest.raises(BaselineConfigError, match="algo.next_actions_scored_at='s'"):
        AlgoConfig.from_dict({"name": "cql", "next_actions_scored_at": "s"})
