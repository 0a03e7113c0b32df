"""``cbop-train-dynamics`` (``scripts/train_dynamics.py``): train (or fetch from the cache)
the dynamics ensemble of one dataset and report its fit.

    cbop-train-dynamics env=hopper-medium-replay-v2
    cbop-train-dynamics env=/data/hopper.hdf5 dynamics.num_members=10 device=cuda

Writes to ``output_dir`` (the Hydra run directory by default):

- ``dynamics_metrics.json``: ``holdout_r2_mean``, ``holdout_r2_per_dim``,
  ``coverage_2sigma``, ``elites``, ``epochs``, ``wall_time_s`` and more (see
  ``cbop_torchrl.trainers.dynamics.train_dynamics``);
- ``dynamics_log.jsonl``: one line of holdout MSE/NLL per epoch (empty on a cache hit);
- ``dynamics.pt``: the model (``cbop_torchrl.modules.dynamics.load_dynamics``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cbop_torchrl.cli import check_output_writable, hydra_entry, refuse
from cbop_torchrl.io import ForeignFileError, check_owned_output, write_failure


def train(cfg: DictConfig) -> dict:
    """Loads the dataset, trains or loads the ensemble, writes the outputs; returns the metrics."""
    import torch

    from cbop_torchrl.data import load_dataset_with_info
    from cbop_torchrl.data.transitions import warn_about_action_range
    from cbop_torchrl.envs import check_data_fits_env, read_env_specs, resolve_task
    from cbop_torchrl.io import atomic_json_dump, atomic_write, open_own_file, owned_outputs
    from cbop_torchrl.modules.dynamics import save_dynamics
    from cbop_torchrl.runtime import resolve_device
    from cbop_torchrl.trainers.datasize import check_dataset_size
    from cbop_torchrl.trainers.dynamics import DynamicsConfig, load_or_train_dynamics
    from cbop_torchrl.trainers.memory import check_dynamics_fits

    if cfg.threads is not None:
        torch.set_num_threads(int(cfg.threads))
    config = DynamicsConfig.from_dict(
        OmegaConf.to_container(cfg.dynamics, resolve=True, enum_to_str=True)
    )
    device = resolve_device(cfg.device)
    dataset, info = load_dataset_with_info(str(cfg.env))
    task = resolve_task(OmegaConf.to_container(cfg.task, resolve=True), info)
    specs = read_env_specs(task)
    check_data_fits_env(info, specs, task)
    check_dataset_size(dataset, info.name, {}, dynamics=config)
    check_dynamics_fits(config, info.obs_dim, info.action_dim, device)
    # the dynamics inputs use the agent's [-1, 1] actions, as in cbop-train (same cache)
    info = dataclasses.replace(info, fingerprint=info.fingerprint + specs.fingerprint_suffix())
    dataset = specs.to_agent_actions(dataset.to(device))
    warn_about_action_range(dataset, info.name)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log_path = output_dir / "dynamics_log.jsonl"
    with owned_outputs(output_dir, PROGRAM):
        atomic_write(log_path, lambda tmp: tmp.write_text(""))  # never truncates a link's target

        def log_epoch(record: dict) -> None:
            with open_own_file(log_path) as handle:
                handle.seek(0, 2)
                handle.write(json.dumps(record) + "\n")

        model, metrics = load_or_train_dynamics(
            dataset, info, config, progress=cfg.progress, log_fn=log_epoch,
            use_cache=cfg.use_cache, termination=task.termination,
        )  # fmt: skip
        metrics.update(dataset=info.name, device=str(device))
        save_dynamics(model, output_dir / "dynamics.pt", metadata={"dataset": info.name})
        atomic_json_dump(metrics, output_dir / "dynamics_metrics.json")
    return metrics


PROGRAM = "cbop-train-dynamics"
OUTPUT_NAMES = ("dynamics_log.jsonl", "dynamics.pt", "dynamics_metrics.json")
"""What this program writes into ``output_dir``; it replaces only its own (its manifest)."""


def validate(cfg: DictConfig) -> None:
    """Refuses (exit 2) before any work an ``output_dir`` that cannot be written or holds a
    file this program did not write."""
    run_dir = HydraConfig.get().runtime.output_dir
    check_output_writable("output_dir", cfg.output_dir, created_dir=run_dir)
    for name in OUTPUT_NAMES:  # a file of the user's is never replaced
        try:
            check_owned_output(Path(cfg.output_dir) / name, PROGRAM)
        except ForeignFileError as error:
            refuse(error, run_dir)


def run(cfg: DictConfig) -> None:
    """The Hydra task: train, print the fit's summary."""
    from cbop_torchrl.data import DatasetError
    from cbop_torchrl.trainers.checkpoint import NonFiniteLossError

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        metrics = train(cfg)
    except (
        DatasetError, ValueError, KeyError, RuntimeError, OSError, NonFiniteLossError
    ) as error:  # fmt: skip
        if (failure := write_failure(error, cfg.output_dir)) is not None:
            error = failure  # a write the system stopped: the file, the cause, what to do
        refuse(error.args[0] if isinstance(error, KeyError) and error.args else error, run_dir)
    summary = {
        key: metrics[key]
        for key in ("holdout_r2_mean", "coverage_2sigma", "epochs", "wall_time_s", "cached")
    }
    print(f"dynamics of {metrics['dataset']}: {json.dumps(summary)}")
    print(f"wrote {Path(cfg.output_dir) / 'dynamics_metrics.json'}")


def main() -> None:
    hydra_entry("train_dynamics", uses_cache=True, validate=validate)(run)()
