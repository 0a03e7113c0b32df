"""DynamicsModel: TensorDict interface, propagation schemes, termination, save/load."""

import pytest
import torch
from tensordict import TensorDict

from cbop_torchrl.modules.dynamics import (
    DynamicsModel,
    GaussianEnsemble,
    load_dynamics,
    load_dynamics_metadata,
    save_dynamics,
)
from cbop_torchrl.registry import get_family

OBS, ACT = 11, 3


def make_model(**kwargs) -> DynamicsModel:
    torch.manual_seed(0)
    ensemble = GaussianEnsemble(OBS, ACT, num_members=5, hidden_sizes=(16, 16))
    # Non-trivial normalization so that save/load must carry it.
    ensemble.set_normalizer(torch.randn(100, OBS + ACT) * 3 + 1, torch.randn(100, OBS + 1) * 0.5)
    return DynamicsModel(ensemble, "hopper", elites=[3, 0, 4], **kwargs)


def batch(*shape: int, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(*shape, OBS, generator=g)
    obs[..., 0] += 1.2  # near hopper's healthy height, so both outcomes occur
    action = torch.rand(*shape, ACT, generator=g) * 2 - 1
    return TensorDict({"observation": obs, "action": action}, list(shape))


def test_per_member_shapes_and_particle_k_uses_elite_k():
    model = make_model(mode="mean")
    td = model(batch(3, 8))
    assert td["next", "observation"].shape == (3, 8, OBS)
    assert td["next", "reward"].shape == (3, 8, 1)
    assert td["next", "terminated"].shape == (3, 8, 1)
    assert td["next", "terminated"].dtype == torch.bool
    for k, member in enumerate([3, 0, 4]):
        mean, _ = model.ensemble.predict(
            td["observation"][k], td["action"][k], torch.tensor([member])
        )
        torch.testing.assert_close(
            td["next", "observation"][k], td["observation"][k] + mean[0, :, :OBS]
        )
        torch.testing.assert_close(td["next", "reward"][k], mean[0, :, OBS:])


def test_per_member_extra_batch_dims_and_wrong_particle_count():
    model = make_model()
    assert model(batch(3, 2, 4))["next", "reward"].shape == (3, 2, 4, 1)
    with pytest.raises(ValueError, match="num_elites=3"):
        model(batch(4, 8))


def test_shared_inputs_any_batch_shape():
    model = make_model(per_member=False)
    for shape in [(8,), (2, 8), (4, 2, 8)]:
        td = model(batch(*shape))
        assert td["next", "observation"].shape == (*shape, OBS)
        assert td["next", "reward"].shape == (*shape, 1)
    td = model(batch(6), mode="mean")
    mean, _ = model.ensemble.predict(td["observation"], td["action"], model.elite_indices)
    torch.testing.assert_close(td["next", "reward"], mean.mean(0)[:, OBS:])


def test_shared_sample_draws_one_elite_per_row():
    model = make_model(per_member=False)
    td = batch(400)
    mean, std = model.ensemble.predict(td["observation"], td["action"], model.elite_indices)
    out = model(td.clone(), generator=torch.Generator().manual_seed(1))
    z = (out["next", "reward"].squeeze(-1) - mean[..., OBS]) / std[..., OBS]  # [K, B]
    nearest = z.abs().argmin(0)
    # Every elite is used for some rows, and the sample is plausible under the picked one.
    assert set(nearest.tolist()) == {0, 1, 2}
    assert (z.abs().min(0).values < 4).all()


def test_sampling_is_reproducible_with_a_generator():
    model = make_model()
    first = model(batch(3, 16), generator=torch.Generator().manual_seed(7))
    again = model(batch(3, 16), generator=torch.Generator().manual_seed(7))
    other = model(batch(3, 16), generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(first["next", "observation"], again["next", "observation"])
    assert not torch.allclose(first["next", "observation"], other["next", "observation"])
    mean = model(batch(3, 16), mode="mean")
    assert not torch.allclose(first["next", "observation"], mean["next", "observation"])


def test_sample_noise_matches_predicted_std():
    model = make_model()
    td = batch(3, 1).expand(3, 4000).clone()
    out = model(td, generator=torch.Generator().manual_seed(0))
    mean, std = model.ensemble.predict(
        td["observation"][:, :1], td["action"][:, :1], model.elite_indices, per_member=True
    )
    empirical = out["next", "reward"].std(dim=1).squeeze(-1)
    torch.testing.assert_close(empirical, std[:, 0, OBS], rtol=0.08, atol=0.0)


def test_termination_comes_from_the_registry_by_name():
    model = make_model()
    assert model.termination_fn is get_family("hopper").termination_fn
    td = model(batch(3, 64))
    terminated = td["next", "terminated"].squeeze(-1)
    expected = get_family("hopper").termination_fn(td["next", "observation"])
    assert torch.equal(terminated, expected)
    assert terminated.any() and not terminated.all()


def test_unknown_termination_is_an_error_not_a_guess():
    ensemble = GaussianEnsemble(OBS, ACT, num_members=2, hidden_sizes=(8,))
    with pytest.raises(KeyError, match="unknown termination function 'swimmer'"):
        DynamicsModel(ensemble, "swimmer")
    assert not DynamicsModel(ensemble, "none")(batch(2, 8))["next", "terminated"].any()
    with pytest.raises(ValueError, match="elite indices"):
        DynamicsModel(ensemble, "hopper", elites=[0, 2])
    with pytest.raises(ValueError, match="mode"):
        DynamicsModel(ensemble, "hopper", mode="median")


def test_outputs_are_float32_under_bf16_autocast():
    model = make_model(mode="mean")
    reference = model(batch(3, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.ensemble.net(torch.randn(5, 4, OBS + ACT)).dtype == torch.bfloat16
        low = model(batch(3, 32))
    assert low["next", "observation"].dtype == torch.float32
    assert low["next", "reward"].dtype == torch.float32
    torch.testing.assert_close(
        low["next", "observation"], reference["next", "observation"], atol=0.1, rtol=0.05
    )


def test_save_load_round_trip_gives_identical_predictions(tmp_path):
    model = make_model()
    path = save_dynamics(model, tmp_path / "dyn.pt", metadata={"note": "x"})
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["elites"] == [3, 0, 4]
    loaded = load_dynamics(path)
    assert loaded.elite_indices.tolist() == [3, 0, 4]
    assert loaded.termination == "hopper"
    assert load_dynamics(path, termination="none").termination == "none"
    assert load_dynamics_metadata(path) == {"note": "x"}
    for name in ("input_mean", "input_std", "target_mean", "target_std"):
        assert torch.equal(getattr(loaded.ensemble, name), getattr(model.ensemble, name))
    for mode in ("mean", "sample"):
        a = model(batch(3, 16), mode=mode, generator=torch.Generator().manual_seed(3))
        b = loaded(batch(3, 16), mode=mode, generator=torch.Generator().manual_seed(3))
        assert torch.equal(a["next", "observation"], b["next", "observation"])
        assert torch.equal(a["next", "reward"], b["next", "reward"])


def test_logvar_stays_within_soft_bounds():
    model = make_model()
    inputs = torch.randn(3, 50, OBS + ACT) * 100  # extreme inputs push the raw log-variance
    _, logvar = model.ensemble(inputs, model.elite_indices)
    assert (logvar <= 0.5 + 1e-4).all() and (logvar >= -10 - 1e-4).all()


def test_separate_reward_network_owns_the_reward_column_alone():
    torch.manual_seed(0)
    ensemble = GaussianEnsemble(OBS, ACT, num_members=3, hidden_sizes=(16,), separate_reward=True)
    assert ensemble.net.layers[-1].out_features == 2 * OBS
    assert ensemble.reward_net.layers[-1].out_features == 2
    inputs = torch.randn(3, 8, OBS + ACT)
    with torch.no_grad():
        mean, logvar = ensemble(inputs)
        assert mean.shape == logvar.shape == (3, 8, OBS + 1)
        ensemble.reward_net.layers[-1].bias.add_(1.0)  # moves the reward's mean and variance
        mean_r, logvar_r = ensemble(inputs)
        ensemble.net.layers[-1].bias.add_(1.0)  # moves the state delta's
        mean_s, logvar_s = ensemble(inputs)
    assert torch.equal(mean_r[..., :OBS], mean[..., :OBS])
    assert torch.equal(logvar_r[..., :OBS], logvar[..., :OBS])
    assert not torch.equal(mean_r[..., OBS:], mean[..., OBS:])
    assert not torch.equal(logvar_r[..., OBS:], logvar[..., OBS:])
    assert torch.equal(mean_s[..., OBS:], mean_r[..., OBS:])
    assert not torch.equal(mean_s[..., :OBS], mean_r[..., :OBS])


@pytest.mark.parametrize("separate_reward", [False, True])
def test_param_groups_hold_every_parameter_once_with_its_layers_decay(separate_reward):
    ensemble = GaussianEnsemble(
        OBS, ACT, num_members=2, hidden_sizes=(8, 8), separate_reward=separate_reward
    )
    groups = ensemble.param_groups([1.0, 2.0, 3.0])
    grouped = [id(p) for group in groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in ensemble.parameters())
    nets = [ensemble.net] + ([ensemble.reward_net] if separate_reward else [])
    for index, decay in enumerate([1.0, 2.0, 3.0]):
        assert {id(p) for p in groups[index]["params"]} == {
            id(net.layers[index].weight) for net in nets
        }
        assert groups[index]["weight_decay"] == decay
    assert groups[-1]["weight_decay"] == 0.0


def test_separate_reward_model_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    ensemble = GaussianEnsemble(OBS, ACT, num_members=3, hidden_sizes=(16,), separate_reward=True)
    model = DynamicsModel(ensemble, "hopper", elites=[2, 0])
    loaded = load_dynamics(save_dynamics(model, tmp_path / "dyn.pt"))
    assert loaded.ensemble.separate_reward and loaded.ensemble.reward_net is not None
    a = model(batch(2, 5), mode="mean")
    b = loaded(batch(2, 5), mode="mean")
    assert torch.equal(a["next", "reward"], b["next", "reward"])
    assert torch.equal(a["next", "observation"], b["next", "observation"])
