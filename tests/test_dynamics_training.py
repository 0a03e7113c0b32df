"""Training the ensemble: fit on a known linear-Gaussian system, elites, cache, CLI."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from refusals import run_one
from tensordict import TensorDict

from cbop_torchrl.trainers.dynamics import (
    DynamicsConfig,
    dynamics_cache_key,
    load_or_train_dynamics,
    split_holdout,
    train_dynamics,
)

OBS, ACT = 11, 3  # hopper sizes; the task only matters for termination
NOISE_STD = torch.linspace(0.1, 0.3, OBS + 1)  # per target dim: 11 delta dims, then reward
REPO = Path(__file__).resolve().parents[1]


def linear_gaussian(num_rows: int, seed: int) -> tuple[TensorDict, torch.Tensor]:
    """``delta = s A + a B + noise``, ``r = [s, a] c + noise``; returns data and the true means."""
    system = torch.Generator().manual_seed(123)
    a_matrix = torch.randn(OBS, OBS, generator=system) * 0.2
    b_matrix = torch.randn(ACT, OBS, generator=system) * 0.3
    c_vector = torch.randn(OBS + ACT, 1, generator=system) * 0.3
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(num_rows, OBS, generator=g)
    action = torch.rand(num_rows, ACT, generator=g) * 2 - 1
    true_mean = torch.cat(
        [obs @ a_matrix + action @ b_matrix, torch.cat([obs, action], -1) @ c_vector], -1
    )
    target = true_mean + torch.randn(num_rows, OBS + 1, generator=g) * NOISE_STD
    data = TensorDict(
        {
            "observation": obs,
            "action": action,
            "next": {"observation": obs + target[:, :OBS], "reward": target[:, OBS:]},
            "dynamics_mask": torch.ones(num_rows, dtype=torch.bool),
        },
        [num_rows],
    )
    return data, true_mean


SMALL = dict(hidden_size=64, num_layers=2, weight_decay=(0.0, 0.0, 0.0), lr=3e-3)


@pytest.fixture(scope="module")
def fitted():
    data, _ = linear_gaussian(8000, seed=0)
    config = DynamicsConfig(
        num_members=4,
        num_elites=2,
        max_epochs=100,
        patience=10,
        improvement_threshold=1e-3,
        **SMALL,
    )
    records = []
    # Many tiny ops: one thread avoids thread-pool stalls on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, metrics = train_dynamics(
            data, "hopper", config, progress=False, log_fn=records.append
        )
    finally:
        torch.set_num_threads(threads)
    return data, config, model, metrics, records


def test_fits_linear_gaussian_system_and_its_noise(fitted):
    _, _, model, metrics, records = fitted
    test_data, true_mean = linear_gaussian(2000, seed=1)
    with torch.no_grad():
        mean, std = model.ensemble.predict(
            test_data["observation"], test_data["action"], model.elite_indices
        )
    mean_error = (mean - true_mean).pow(2).mean(dim=(0, 1)).sqrt()
    assert (mean_error < 0.5 * NOISE_STD).all(), mean_error / NOISE_STD
    variance_ratio = std.pow(2).mean(dim=(0, 1)) / NOISE_STD.pow(2)
    assert ((variance_ratio > 0.8) & (variance_ratio < 1.2)).all(), variance_ratio
    assert metrics["holdout_r2_mean"] > 0.9
    assert 0.9 < metrics["coverage_2sigma"] < 0.99
    assert len(records) == metrics["epochs"]
    assert {"holdout_mse", "holdout_nll", "train_loss"} <= set(records[0])
    assert records[-1]["holdout_mse"] < records[0]["holdout_mse"]


def test_members_differ_after_training(fitted):
    data, _, model, _, _ = fitted
    weights = model.ensemble.net.layers[0].weight
    assert not torch.allclose(weights[0], weights[1])
    with torch.no_grad():
        mean, _ = model.ensemble.predict(data["observation"][:100], data["action"][:100])
    assert (mean[0] - mean[1]).abs().max() > 1e-3


def test_elites_are_the_best_members_on_the_holdout(fitted):
    data, config, model, metrics, _ = fitted
    hold_idx, _ = split_holdout(data.shape[0], config)
    assert len(hold_idx) == metrics["num_holdout"] == 1600
    holdout = data[hold_idx]
    target = torch.cat(
        [holdout["next", "observation"] - holdout["observation"], holdout["next", "reward"]], -1
    )
    with torch.no_grad():
        mean, _ = model.ensemble.predict(holdout["observation"], holdout["action"])
    # Independent recomputation: standardized MSE of every member.
    mse = ((target - mean) / model.ensemble.target_std).pow(2).mean(dim=(1, 2))
    best = set(mse.argsort()[: config.num_elites].tolist())
    assert set(model.elite_indices.tolist()) == best == set(metrics["elites"])
    assert mse[model.elite_indices[0]] == mse.min()


def test_timeout_rows_are_excluded():
    data, _ = linear_gaussian(600, seed=2)
    data["dynamics_mask"][::3] = False
    data["next", "observation"][::3] = 1e6  # garbage a timeout row could hold
    config = DynamicsConfig(num_members=2, num_elites=1, max_epochs=1, **SMALL)
    model, metrics = train_dynamics(data, "hopper", config, progress=False)
    assert metrics["num_train"] + metrics["num_holdout"] == 400
    assert model.ensemble.target_std.max() < 10


def test_bad_config_and_data_are_rejected():
    with pytest.raises(ValueError, match="num_elites=5"):
        DynamicsConfig(num_members=3, num_elites=5)
    with pytest.raises(ValueError, match="weight_decay"):
        DynamicsConfig(num_layers=2)
    with pytest.raises(ValueError, match="unknown dynamics config keys"):
        DynamicsConfig.from_dict({"num_memebers": 3})
    data, _ = linear_gaussian(50, seed=0)
    with pytest.raises(KeyError, match="dynamics_mask"):
        train_dynamics(data.exclude("dynamics_mask"), "hopper", DynamicsConfig())


def test_cache_reuses_a_trained_ensemble(tmp_path, monkeypatch):
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path))
    data, _ = linear_gaussian(500, seed=3)
    info = SimpleNamespace(name="lin", fingerprint="lin-500")
    config = DynamicsConfig(num_members=2, num_elites=1, max_epochs=2, **SMALL)
    model, metrics = load_or_train_dynamics(data, info, config, False, termination="hopper")
    assert metrics["cached"] is False
    # the termination is applied at load time: another task's run reuses the same ensemble
    again, cached = load_or_train_dynamics(data, info, config, False, termination="none")
    assert again.termination == "none" and model.termination == "hopper"
    assert cached["cached"] is True and cached["cache_path"] == metrics["cache_path"]
    assert Path(metrics["cache_path"]).is_relative_to(tmp_path)
    probe = data[:20].clone()
    a = model(probe.clone().unsqueeze(0), mode="mean")["next", "observation"]
    b = again(probe.clone().unsqueeze(0), mode="mean")["next", "observation"]
    assert torch.equal(a, b)
    other = DynamicsConfig(num_members=2, num_elites=1, max_epochs=2, seed=1, **SMALL)
    _, fresh = load_or_train_dynamics(data, info, other, False, termination="hopper")
    assert fresh["cached"] is False and fresh["cache_path"] != metrics["cache_path"]


def write_tiny_hopper_file(path: Path, num_episodes: int = 6, length: int = 50) -> None:
    """A D4RL-format file of chained random-walk episodes, each cut by a timeout."""
    rng = np.random.default_rng(0)
    steps = rng.normal(0, 0.1, (num_episodes, length + 1, OBS)).cumsum(1).astype(np.float32)
    num_rows = num_episodes * length
    timeouts = np.zeros((num_episodes, length), dtype=bool)
    timeouts[:, -1] = True
    with h5py.File(path, "w") as handle:
        handle["observations"] = steps[:, :-1].reshape(num_rows, OBS)
        handle["next_observations"] = steps[:, 1:].reshape(num_rows, OBS)
        handle["actions"] = rng.uniform(-1, 1, (num_rows, ACT)).astype(np.float32)
        handle["rewards"] = rng.normal(size=num_rows).astype(np.float32)
        handle["terminals"] = np.zeros(num_rows, dtype=bool)
        handle["timeouts"] = timeouts.reshape(-1)
        handle["metadata/family"] = "hopper"


def script_run(tmp_path: Path, *overrides: str):  # noqa: ANN201 (inprocess.Finished)
    """``scripts/train_dynamics.py *overrides`` from ``tmp_path``, in this process."""
    env = {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    return run_one("train_dynamics.py", list(overrides), tmp_path, env)


def test_script_writes_metrics_and_rejects_bad_input(tmp_path):
    """Both commands of ``scripts/train_dynamics.py``, in this process (tests/refusals.py)."""
    data_path = tmp_path / "hopper-tiny.hdf5"
    write_tiny_hopper_file(data_path)
    out = tmp_path / "out"
    result = script_run(
        tmp_path, f"env={data_path}", f"output_dir={out}", "progress=false",
        "dynamics.num_members=3", "dynamics.num_elites=2", "dynamics.max_epochs=2",
        "dynamics.hidden_size=16", "dynamics.num_layers=1", "dynamics.weight_decay=[0,0]",
    )  # fmt: skip
    bad = script_run(tmp_path, f"env={tmp_path / 'missing.hdf5'}", f"output_dir={out}")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "dynamics_metrics.json").read_text())
    for key in ("holdout_r2_mean", "coverage_2sigma", "elites", "epochs", "wall_time_s"):
        assert key in metrics
    assert len(metrics["elites"]) == 2 and metrics["epochs"] == 2
    assert len((out / "dynamics_log.jsonl").read_text().splitlines()) == 2
    assert (out / "dynamics.pt").exists()

    assert bad.returncode != 0
    assert "missing.hdf5" in bad.stderr and "Traceback" not in bad.stderr


def test_hydra_group_lists_every_config_field_with_the_defaults():
    from omegaconf import OmegaConf

    path = REPO / "cbop_torchrl" / "configs" / "dynamics" / "default.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert DynamicsConfig.from_dict(values) == DynamicsConfig()
    assert set(values) == {field.name for field in dataclasses.fields(DynamicsConfig)}


def test_a_separate_reward_network_learns_the_reward(one_torch_thread):
    data, true_mean = linear_gaussian(2000, seed=4)
    config = DynamicsConfig(
        num_members=2, num_elites=1, max_epochs=40, separate_reward=True, **SMALL
    )
    model, metrics = train_dynamics(data, "hopper", config, progress=False)
    assert model.ensemble.reward_net is not None
    with torch.no_grad():
        mean, _ = model.ensemble.predict(data["observation"], data["action"], model.elite_indices)
    reward_error = (mean[..., OBS] - true_mean[:, OBS]).pow(2).mean().sqrt()
    assert reward_error < 0.5 * NOISE_STD[OBS], reward_error
    assert metrics["holdout_r2_per_dim"][-1] > 0.8
    # Named in the cache key only when on: earlier cache entries (and run hashes) still match.
    info = SimpleNamespace(name="lin", fingerprint="lin-2000")
    off = DynamicsConfig(**SMALL)
    assert "separate_reward" not in off.to_dict() and config.to_dict()["separate_reward"]
    assert dynamics_cache_key(info, off) != dynamics_cache_key(
        info, DynamicsConfig(separate_reward=True, **SMALL)
    )
    with pytest.raises(ValueError, match="separate_reward='yes' must be true or false"):
        DynamicsConfig(separate_reward="yes")
