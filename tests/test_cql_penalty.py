"""CQL's penalty is the authors' code's, and TorchRL's two choices remain selectable.

``AuthorsCQLLoss`` and stock ``torchrl.objectives.CQLLoss`` get the same networks, batch and
random draws; the critic inputs and outputs of their penalties are recorded.
- Scoring: uniform actions and the policy's actions at ``s`` are scored at ``s`` by both; the
  policy's actions at ``s'`` are the same actions in both, scored at ``s`` by the authors'
  choice and at ``s'`` by CQLLoss's.
- Log-sum-exp: the authors' runs over all ``3 N`` actions of a state (their
  ``torch.cat([...], 1)`` of ``[B, N, 1]`` tensors); CQLLoss's over the three groups' actions
  of each draw. The authors' is recomputed here from the recorded critic outputs.
- With both of CQLLoss's choices, ``AuthorsCQLLoss`` is ``CQLLoss`` to the bit."""

from __future__ import annotations

import math

import pytest
import torch
from batches import random_transitions
from torchrl.objectives import CQLLoss

from cbop_torchrl.baselines import AlgoConfig, BaselineConfigError, build_baseline
from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.cql import AuthorsCQLLoss, critics_loop

OBS, ACT, ROWS, NUM_RANDOM, CRITICS = 4, 2, 6, 3, 2
WEIGHT, TEMPERATURE = 5.0, 0.7


def _loss(cls: type, **choices: str) -> CQLLoss:
    torch.manual_seed(0)
    loss = cls(
        make_actor(OBS, ACT, (8,)), make_qvalue_ensemble(CRITICS, OBS, ACT, (8,)),
        action_spec=action_spec(ACT), num_random=NUM_RANDOM, deterministic_backup=True,
        min_q_weight=WEIGHT, temperature=TEMPERATURE, **choices,
    )  # fmt: skip
    loss.make_value_estimator(gamma=0.99)
    return loss


def _penalty(loss: CQLLoss, batch) -> dict[str, torch.Tensor]:
    """The penalty, the critics' gradients, and what the critics scored and returned.

    ``observation``, ``action`` and ``q`` are ``[3, CRITICS, B*N, .]``: uniform actions, the
    policy's at s, the policy's at s' (each for each critic); ``log_pi`` ``[2, B*N]`` holds the
    log-probs of the policy's draws (at s, at s')."""
    seen = {"log_pi": []}
    scored, draw = loss._vmap_qvalue_network00, loss._get_policy_actions

    def record(td, params):
        seen["observation"] = td.get("observation").clone()
        seen["action"] = td.get("action").clone()
        out = scored(td, params)
        seen["q"] = out.get("state_action_value").detach().clone()
        return out

    def record_draws(data, params, num_actions):
        actions, log_pi = draw(data, params, num_actions=num_actions)
        seen["log_pi"].append(log_pi.detach().clone())
        return actions, log_pi

    loss._vmap_qvalue_network00 = record
    loss._get_policy_actions = record_draws
    torch.manual_seed(5)
    td = batch.clone()
    loss.q_loss(td)
    penalty, _ = loss.cql_loss(td)
    params = list(loss.qvalue_network_params.values(True, True))
    grads = torch.autograd.grad(penalty, params, allow_unused=True)
    shape = (3, CRITICS, ROWS * NUM_RANDOM, -1)
    return {
        "penalty": penalty.detach(),
        "grads": [g for g in grads if g is not None],
        "pred": torch.stack([td.get("pred_q1"), td.get("pred_q2")]).detach(),  # [C, B, 1]
        "log_pi": torch.stack(seen["log_pi"]),
        **{key: seen[key].reshape(shape) for key in ("observation", "action", "q")},
    }


def _batch():
    batch = random_transitions((ROWS,), OBS, ACT)
    batch.set("action", batch.get("action").clamp(-0.9, 0.9))
    return batch


def test_next_state_actions_are_scored_at_the_state_with_the_same_draws() -> None:
    batch = _batch()
    states = batch.get("observation").repeat_interleave(NUM_RANDOM, dim=0)  # [B*N, OBS]
    next_states = batch.get(("next", "observation")).repeat_interleave(NUM_RANDOM, dim=0)
    stock = _penalty(_loss(CQLLoss), batch)
    authors = _penalty(_loss(AuthorsCQLLoss), batch)

    torch.testing.assert_close(authors["action"], stock["action"], rtol=0, atol=0)  # same draws
    for group in (0, 1):  # uniform actions, the policy's at s: both at s
        assert torch.equal(authors["observation"][group], stock["observation"][group])
        assert torch.equal(authors["observation"][group], states.expand(CRITICS, -1, -1))
    assert torch.equal(stock["observation"][2], next_states.expand(CRITICS, -1, -1))  # at s'
    assert torch.equal(authors["observation"][2], states.expand(CRITICS, -1, -1))  # at s
    assert not torch.allclose(authors["penalty"], stock["penalty"])


def _authors_penalty(q: torch.Tensor, pred: torch.Tensor, log_pi: torch.Tensor) -> torch.Tensor:
    """The authors' penalty from the critics' outputs, as rlkit/torch/sac/cql.py computes it.

    ``q`` [3, C, B*N, 1] (uniform, at s, at s'), ``pred`` [C, B, 1], ``log_pi`` [2, B*N]
    (at s, at s'); returns the penalty summed over the critics."""
    log_density = math.log(0.5**ACT)
    total = torch.zeros(())
    for critic in range(CRITICS):
        rand, curr, nxt = (q[g, critic].view(ROWS, NUM_RANDOM, 1) for g in range(3))
        cat = torch.cat([
            rand - log_density,
            nxt - log_pi[1].view(ROWS, NUM_RANDOM, 1),
            curr - log_pi[0].view(ROWS, NUM_RANDOM, 1),
        ], 1)  # [B, 3N, 1]  # fmt: skip
        pushed = torch.logsumexp(cat / TEMPERATURE, dim=1).mean() * WEIGHT * TEMPERATURE
        total = total + pushed - pred[critic].mean() * WEIGHT
    return total


def test_the_logsumexp_runs_over_every_sampled_action_of_a_state() -> None:
    batch = _batch()
    for scored_at in ("state", "next_state"):
        loss = _loss(AuthorsCQLLoss, next_actions_scored_at=scored_at)
        got = _penalty(loss, batch)
        expected = _authors_penalty(got["q"], got["pred"], got["log_pi"])
        torch.testing.assert_close(got["penalty"], expected, rtol=1e-6, atol=1e-6)
        per_draw = _penalty(
            _loss(AuthorsCQLLoss, next_actions_scored_at=scored_at, logsumexp_over="draw"),
            batch,
        )
        torch.testing.assert_close(per_draw["q"], got["q"], rtol=0, atol=0)  # same critic passes
        assert (got["penalty"] - per_draw["penalty"]).abs() > 0.1  # only the grouping differs


def test_with_torchrls_choices_the_loss_is_cql_loss_to_the_bit() -> None:
    batch = _batch()
    stock = _penalty(_loss(CQLLoss), batch)
    same = _penalty(
        _loss(AuthorsCQLLoss, next_actions_scored_at="next_state", logsumexp_over="draw"), batch
    )
    assert torch.equal(same["penalty"], stock["penalty"])
    assert len(same["grads"]) == len(stock["grads"]) > 0
    for mine, theirs in zip(same["grads"], stock["grads"], strict=True):
        assert torch.equal(mine, theirs)


def test_the_cql_recipe_takes_the_authors_penalty_and_torchrls_is_an_option() -> None:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=OBS, action_dim=ACT)
    config = RunConfig()
    config.agent.hidden_sizes = [8]
    recipe = AlgoConfig(name="cql")
    assert (recipe.next_actions_scored_at, recipe.logsumexp_over) == ("state", "state")
    default = build_baseline(AlgoConfig(name="cql", hidden_sizes=[8]), config, info, "cpu").loss
    assert type(default) is AuthorsCQLLoss
    assert (default.next_actions_scored_at, default.logsumexp_over) == ("state", "state")
    one = AlgoConfig(name="cql", hidden_sizes=[8], logsumexp_over="draw")
    assert build_baseline(one, config, info, "cpu").loss.logsumexp_over == "draw"
    torchrl = AlgoConfig(
        name="cql", hidden_sizes=[8], next_actions_scored_at="next_state", logsumexp_over="draw"
    )
    assert type(build_baseline(torchrl, config, info, "cpu").loss) is CQLLoss
    with pytest.raises(BaselineConfigError, match="algo.next_actions_scored_at='s'"):
        AlgoConfig.from_dict({"name": "cql", "next_actions_scored_at": "s"})
    with pytest.raises(BaselineConfigError, match="algo.logsumexp_over=state"):
        AlgoConfig.from_dict({"name": "cql", "logsumexp_over": "states"})


def _loss_and_grads(loss: CQLLoss, batch) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Every term of the loss on ``batch`` and the critics' gradients of the Q and CQL terms."""
    torch.manual_seed(5)
    out = loss(batch.clone())
    params = list(loss.qvalue_network_params.values(True, True))
    critic_terms = out.get("loss_qvalue") + out.get("loss_cql")
    grads = torch.autograd.grad(critic_terms, params)
    return {key: value.detach() for key, value in out.items() if key.startswith("loss_")}, grads


@pytest.mark.parametrize("choices", [{}, {"next_actions_scored_at": "next_state"}])
def test_critics_one_after_another_compute_the_batched_critics_loss(choices) -> None:
    batch = _batch()
    batched, batched_grads = _loss_and_grads(_loss(AuthorsCQLLoss, **choices), batch)
    looped, looped_grads = _loss_and_grads(
        _loss(AuthorsCQLLoss, deactivate_vmap=True, **choices), batch
    )
    assert sorted(looped) == sorted(batched) and "loss_cql" in looped
    for key, value in batched.items():
        torch.testing.assert_close(looped[key], value, rtol=1e-5, atol=1e-6)
    assert len(looped_grads) == len(batched_grads) > 0
    for mine, theirs in zip(looped_grads, batched_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_critic_passes_loop_on_a_cpu_by_default_and_can_be_chosen() -> None:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=OBS, action_dim=ACT)
    config = RunConfig()
    config.agent.hidden_sizes = [8]
    assert AlgoConfig(name="cql").critic_passes == "auto"
    for passes, loops in (("auto", True), ("loop", True), ("vmap", False)):
        algo = AlgoConfig(name="cql", hidden_sizes=[8], critic_passes=passes)
        assert build_baseline(algo, config, info, "cpu").loss.deactivate_vmap is loops
    assert critics_loop("auto", "cuda:0") is False and critics_loop("loop", "cuda") is True
    with pytest.raises(BaselineConfigError, match="algo.critic_passes"):
        AlgoConfig.from_dict({"name": "cql", "critic_passes": "serial"})
