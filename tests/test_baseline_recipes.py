"""The baselines' published recipes: each algo config's values, standardized states, IQL's
reward scaling and actor schedule, and a standardized policy loaded back from its file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.baselines import (
    AlgoConfig,
    _dataset_for,
    baseline_batch_size,
    baseline_hidden_sizes,
    build_baseline,
)
from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.modules.standardize import STD_EPS, observation_statistics
from cbop_torchrl.trainers.recipes import (
    cosine_factor,
    return_range_scale,
    trajectory_returns,
)

CONFIGS = Path(__file__).resolve().parents[1] / "cbop_torchrl" / "configs" / "algo"

#: Each baseline's recipe for D4RL locomotion, as its paper and its authors' code give it.
RECIPES = {
    "td3bc": {  # Fujimoto & Gu 2021; sfujim/TD3_BC main.py
        "batch_size": 256, "hidden_sizes": [256, 256], "actor_lr": 3e-4, "critic_lr": 3e-4,
        "alpha": 2.5, "policy_noise": 0.2, "noise_clip": 0.5, "policy_delay": 2,
        "normalize_states": True, "reward_scale": "none",
    },
    "iql": {  # Kostrikov et al. 2022; ikostrikov/implicit_q_learning configs/mujoco_config.py
        "batch_size": 256, "hidden_sizes": [256, 256], "actor_lr": 3e-4, "critic_lr": 3e-4,
        "value_lr": 3e-4, "expectile": 0.7, "temperature": 3.0, "normalize_states": False,
        "reward_scale": "return_range", "actor_lr_schedule": "cosine",
        "policy_distribution": "tanh_mean_gaussian", "update_order": "value_first",
    },
    "cql": {  # Kumar et al. 2020; aviralkumar2907/CQL README's gym command and code
        "batch_size": 256, "hidden_sizes": [256, 256, 256], "actor_lr": 1e-4,
        "critic_lr": 3e-4, "min_q_weight": 5.0, "num_random": 10, "with_lagrange": False,
        "normalize_states": False, "reward_scale": "none", "next_actions_scored_at": "state",
        "logsumexp_over": "state",
    },
    "bc": {  # CORL's any_percent_bc
        "batch_size": 256, "hidden_sizes": [256, 256], "actor_lr": 3e-4,
        "normalize_states": True,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_algo_config_is_its_papers_recipe(name: str) -> None:
    config = AlgoConfig.from_dict(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
    assert {key: getattr(config, key) for key in RECIPES[name]} == RECIPES[name]


def dataset(rows: int = 64, obs_dim: int = 4) -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    observation = torch.randn(rows, obs_dim, generator=generator) * 3.0 + 5.0
    done = torch.zeros(rows, 1, dtype=torch.bool)
    done[[9, 29, 49]] = True  # trajectories of 10, 20, 20 rows and an unfinished one of 14
    return TensorDict(
        {
            "observation": observation,
            "action": torch.rand(rows, 2, generator=generator) * 2 - 1,
            "next": {
                "observation": observation + 0.1,
                "reward": torch.ones(rows, 1),
                "terminated": done.clone(),
                "done": done,
            },
        },
        batch_size=[rows],
    )


def test_iqls_rewards_are_scaled_by_the_range_of_trajectory_returns() -> None:
    data = dataset()
    returns = trajectory_returns(data.get(("next", "reward")), data.get(("next", "done")))
    assert returns.tolist() == [10.0, 20.0, 20.0, 14.0]
    assert return_range_scale(data) == pytest.approx(1000.0 / (20.0 - 10.0))
    scaled = _dataset_for("iql", data, return_range_scale(data))
    assert torch.allclose(scaled.get(("next", "reward")), torch.full((64, 1), 100.0))


def test_the_actors_cosine_schedule_decays_to_zero() -> None:
    assert cosine_factor(0, 100) == 1.0
    assert cosine_factor(50, 100) == pytest.approx(0.5)
    assert cosine_factor(100, 100) == pytest.approx(0.0, abs=1e-12)
    assert cosine_factor(25, 100) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)


def small_config() -> RunConfig:
    config = RunConfig()
    config.agent.hidden_sizes = [8]
    return config


@pytest.mark.parametrize("name", ["td3bc", "bc"])
def test_standardized_actors_read_raw_observations(name: str) -> None:
    data = dataset()
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=4, action_dim=2)
    algo = AlgoConfig(name=name, hidden_sizes=[8], normalize_states=True)
    torch.manual_seed(1)
    actor = build_baseline(algo, small_config(), info, torch.device("cpu"), data).actor
    torch.manual_seed(1)
    plain = build_baseline(
        AlgoConfig(name=name, hidden_sizes=[8]), small_config(), info, torch.device("cpu")
    ).actor
    loc, scale = observation_statistics(data)
    observation = data.get("observation")
    assert torch.allclose(scale, observation.std(0, correction=0) + STD_EPS)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        raw = actor(TensorDict({"observation": observation}, [64])).get("action")
        standardized = TensorDict({"observation": (observation - loc) / scale}, [64])
        expected = plain(standardized).get("action")
    assert torch.allclose(raw, expected, atol=1e-6)
    # The same networks without the standardization act otherwise on these states.
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        unstandardized = plain(TensorDict({"observation": observation}, [64])).get("action")
    assert not torch.allclose(raw, unstandardized, atol=1e-3)


def test_a_standardizing_recipe_needs_the_data() -> None:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=4, action_dim=2)
    with pytest.raises(ValueError, match="pass the training data"):
        build_baseline(AlgoConfig(name="td3bc", normalize_states=True), small_config(), info, "cpu")


def test_the_recipes_sizes_apply_except_on_the_smoke_test_preset() -> None:
    algo = AlgoConfig(name="cql", batch_size=256, hidden_sizes=[256, 256, 256])
    config = small_config()
    config.train.batch_size = 16
    assert baseline_batch_size(algo, config) == 256
    assert baseline_hidden_sizes(algo, config) == (256, 256, 256)
    config.preset = "debug"
    assert baseline_batch_size(algo, config) == 16
    assert baseline_hidden_sizes(algo, config) == (8,)


def test_iqls_actor_is_a_gaussian_around_a_tanh_mean_with_one_std_for_every_state() -> None:
    info = DatasetInfo("hopper-x", "fp", 64, "hdf5", obs_dim=4, action_dim=2)
    recipe = AlgoConfig.from_dict(yaml.safe_load((CONFIGS / "iql.yaml").read_text()))
    recipe.hidden_sizes = [8]
    parts = build_baseline(recipe, small_config(), info, torch.device("cpu"))
    actor, head = parts.actor, parts.actor.module[0].module[1]  # MLP, then TanhMeanHead
    assert parts.actor_kind == "tanh_mean_gaussian"
    observation = torch.randn(5, 4) * 10  # large inputs: a mean far out would show
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([-9.0, 0.3]))  # below the floor, inside the range
        dist = actor.get_dist(TensorDict({"observation": observation}, [5]))
        features = actor.module[0].module[0](observation)  # [5, 2] before the head
    torch.testing.assert_close(dist.mean, torch.tanh(features))
    torch.testing.assert_close(dist.stddev, torch.tensor([-5.0, 0.3]).exp().expand(5, 2))
    edges = torch.tensor([[1.0, -1.0]]).expand(5, 2)  # clipped data actions: no atanh needed
    expected = torch.distributions.Normal(torch.tanh(features), dist.stddev).log_prob(edges)
    torch.testing.assert_close(dist.log_prob(edges), expected.sum(-1))
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        action = actor(TensorDict({"observation": observation}, [5])).get("action")
    torch.testing.assert_close(action, torch.tanh(features))  # it acts with its mean
    trained = {id(p) for p in parts.groups[0][1]}  # the actor's group holds the std
    assert id(head.log_std) in trained
