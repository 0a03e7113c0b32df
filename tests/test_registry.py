import pytest
import torch

from cbop_torchrl.registry import (
    EnvFamily,
    d4rl_ids,
    get_family,
    never_terminates,
    parse_d4rl_id,
    register_family,
)


def test_eighteen_d4rl_ids_parse_back_to_their_family():
    ids = d4rl_ids()
    assert len(ids) == 18
    for dataset_id in ids:
        family, kind = parse_d4rl_id(dataset_id)
        assert dataset_id == f"{family.name}-{kind}-v2"
    assert parse_d4rl_id("ant-medium-v2") is None
    assert parse_d4rl_id("hopper-medium-v0") is None


def test_normalized_score_matches_d4rl_constants():
    hopper = get_family("hopper")
    assert hopper.normalized_score(-20.272305) == pytest.approx(0.0)
    assert hopper.normalized_score(3234.3) == pytest.approx(100.0)


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


def test_halfcheetah_never_terminates_and_unknown_family_is_explained():
    assert get_family("halfcheetah").termination_fn is never_terminates
    with pytest.raises(KeyError, match="registered families"):
        get_family("ant")
    with pytest.raises(ValueError, match="already registered"):
        register_family(EnvFamily("hopper", "Hopper-v4", 11, 3, 0.0, 1.0, never_terminates))
