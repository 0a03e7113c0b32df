"""Diverged stages are refused and never cached: a dynamics model whose loss diverged or a
cached one holding NaN (trained again), and a BC stage that ends in NaN.

Everything runs in-process on tiny generated files except one ``train_dynamics.py`` run
(a diverged model must end that script with exit code 2, not 0).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5

import cbop_torchrl.trainers.pretrain as pretrain
from cbop_torchrl.config import PretrainConfig
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.io import (
    cache_dir,
)
from cbop_torchrl.modules.dynamics import dynamics_state, load_dynamics
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError, save_stage
from cbop_torchrl.trainers.dynamics import DynamicsConfig, load_or_train_dynamics

REPO = Path(__file__).resolve().parents[1]

TINY = dict(num_members=2, num_elites=1, hidden_size=8, num_layers=1, weight_decay=(0.0, 0.0))


def hopper_data(tmp_path: Path):
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(40, 40, 40))
    return load_dataset_with_info(str(file))


def test_a_diverged_dynamics_model_is_refused_and_never_cached(tmp_path: Path) -> None:
    data, info = hopper_data(tmp_path)
    config = DynamicsConfig(lr=1e8, max_epochs=3, **TINY)
    with pytest.raises(NonFiniteLossError, match=r"diverged.*dynamics\.lr=1e\+08"):
        load_or_train_dynamics(data, info, config, progress=False, termination="hopper")
    assert not list(cache_dir("dynamics").rglob("model.pt"))
    assert not list(cache_dir("dynamics").rglob("metrics.json"))


def test_a_cached_nan_dynamics_model_is_trained_again(tmp_path: Path) -> None:
    data, info = hopper_data(tmp_path)
    config = DynamicsConfig(max_epochs=2, **TINY)
    model, metrics = load_or_train_dynamics(data, info, config, False, termination="hopper")
    path = Path(metrics["cache_path"])
    broken = load_dynamics(path)
    with torch.no_grad():
        next(broken.ensemble.parameters()).fill_(float("nan"))
    record = torch.load(path, weights_only=True)["stage"]["data"]
    save_stage(dynamics_state(broken), path, record)  # what an earlier version cached
    with pytest.warns(UserWarning, match="not finite"):
        again, metrics = load_or_train_dynamics(data, info, config, False, termination="hopper")
    assert metrics["cached"] is False
    assert all(torch.isfinite(p).all() for p in again.ensemble.parameters())


def test_train_dynamics_script_exits_2_on_a_diverged_model(tmp_path: Path) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(40, 40, 40))
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, str(REPO / "scripts" / "train_dynamics.py"), f"env={file}",
        f"output_dir={tmp_path / 'out'}", "progress=false", "dynamics.lr=1e8",
        "dynamics.num_members=2", "dynamics.num_elites=1", "dynamics.max_epochs=3",
        "dynamics.hidden_size=8", "dynamics.num_layers=1", "dynamics.weight_decay=[0,0]",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "diverged" in done.stderr, done.stderr
    assert "dynamics.lr=1e+08" in done.stderr and "dynamics.lr=0.001" in done.stderr
    assert not (tmp_path / "out" / "dynamics_metrics.json").exists()
    assert not list((tmp_path / "cache").rglob("model.pt"))


def test_a_bc_stage_that_ends_in_nan_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, info = hopper_data(tmp_path)

    def diverging_last_step(name, loss, *args, **kwargs):  # noqa: ANN001, ANN202
        with torch.no_grad():
            next(loss.parameters()).fill_(float("inf"))
        return {}

    monkeypatch.setattr(pretrain, "run_supervised_stage", diverging_last_step)
    with pytest.raises(NonFiniteLossError, match=r"bc stage diverged.*bc\.lr"):
        pretrain.load_or_train_bc(
            data, info.fingerprint, info.obs_dim, info.action_dim, [8],
            PretrainConfig(steps=2, batch_size=4), seed=0, progress=False,
        )  # fmt: skip
    assert not list(cache_dir("pretrain").rglob("result.pt"))
