import pytest
import torch

from cbop_torchrl.registry import (
    Task,
    d4rl_ids,
    families,
    get_family,
    get_termination,
    never_terminates,
    parse_d4rl_id,
    register_family,
    register_termination,
    termination_names,
)


def test_d4rl_ids_of_the_four_locomotion_families_parse_back():
    ids = d4rl_ids()
    assert len(ids) == 24  # hopper, walker2d, halfcheetah, ant x 6 kinds
    for dataset_id in ids:
        family, kind = parse_d4rl_id(dataset_id)
        assert dataset_id == f"{family.name}-{kind}-v2"
    assert parse_d4rl_id("ant-medium-v2")[0].name == "ant"
    assert parse_d4rl_id("hopper-medium-v0") is None
    assert parse_d4rl_id("swimmer-medium-v2") is None


def test_the_registry_holds_no_sizes():
    """Sizes come from the data and the environment's specs, never from the registry."""
    for task in families().values():
        assert not hasattr(task, "obs_dim") and not hasattr(task, "action_dim")


@pytest.mark.parametrize(
    ("name", "ref_min", "ref_max"),
    [
        ("hopper", -20.272305, 3234.3),
        ("walker2d", 1.629008, 4592.3),
        ("halfcheetah", -280.178953, 12135.0),
        ("ant", -325.6, 3879.7),
    ],
)
def test_normalized_score_matches_d4rl_constants(name, ref_min, ref_max):
    task = get_family(name)
    assert task.normalized_score(ref_min) == pytest.approx(0.0)
    assert task.normalized_score(ref_max) == pytest.approx(100.0)
    assert task.normalized_score((ref_min + ref_max) / 2) == pytest.approx(50.0)


def test_a_task_without_reference_scores_has_no_normalized_score():
    task = Task("Swimmer-v4", "Swimmer-v4")
    assert not task.has_reference_scores and task.normalized_score(123.0) is None
    with pytest.raises(ValueError, match="both ref_min_score and ref_max_score or neither"):
        Task("x", "Swimmer-v4", ref_min_score=0.0)
    with pytest.raises(ValueError, match="must be finite and differ"):
        Task("x", "Swimmer-v4", ref_min_score=1.0, ref_max_score=1.0)


def test_hopper_termination_rules():
    term = get_family("hopper").termination_fn
    healthy = torch.zeros(11)
    healthy[0] = 1.25
    assert not term(healthy)
    for index, value in [(0, 0.6), (1, 0.25), (5, 150.0), (3, float("nan"))]:
        bad = healthy.clone()
        bad[index] = value
        assert term(bad), (index, value)


def test_walker_termination_rules_and_batching():
    term = get_family("walker2d").termination_fn
    obs = torch.zeros(4, 3, 17)
    obs[..., 0] = 1.2
    obs[1, 2, 0] = 2.1
    obs[2, 0, 1] = -1.5
    done = term(obs)
    assert done.shape == (4, 3) and done.dtype == torch.bool
    assert done.sum() == 2 and done[1, 2] and done[2, 0]


def test_ant_termination_uses_the_torso_height_of_either_layout():
    term = get_family("ant").termination_fn
    for width in (27, 111):  # gymnasium's default and D4RL's contact-force layout
        obs = torch.zeros(5, width)
        obs[:, 0] = torch.tensor([0.55, 0.19, 1.01, 0.2, 1.0])
        obs[3, 50 % width] = float("inf")
        assert term(obs).tolist() == [False, True, True, True, False]


def test_ant_matches_d4rl_layout_in_gymnasium():
    import gymnasium

    ant = get_family("ant")
    env = gymnasium.make(ant.gym_id, **ant.gym_kwargs)
    assert env.observation_space.shape == (111,) and env.action_space.shape == (8,)
    env.close()


def test_halfcheetah_never_terminates_and_unknown_names_are_explained():
    assert get_family("halfcheetah").termination_fn is never_terminates
    assert get_termination("none") is never_terminates
    assert set(termination_names()) == {"none", "hopper", "walker2d", "halfcheetah", "ant"}
    with pytest.raises(KeyError, match="task.gym_id=<id> and task.termination"):
        get_family("swimmer")
    with pytest.raises(KeyError, match="registered: .*none"):
        get_termination("swimmer")
    with pytest.raises(ValueError, match="already registered"):
        register_family(Task("hopper", "Hopper-v4", {}, 0.0, 1.0, "hopper"))
    with pytest.raises(ValueError, match="already registered"):
        register_termination("hopper", never_terminates)
