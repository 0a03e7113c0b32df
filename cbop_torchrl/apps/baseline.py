"""``cbop-baseline`` (``scripts/baseline.py``): a model-free offline baseline (BC, TD3+BC,
IQL, CQL) on one dataset, in CBOP's run format.

    cbop-baseline algo=td3bc                       # bundled demo data, CPU preset
    cbop-baseline algo=iql env=/data/hopper-medium-replay-gen.hdf5 seed=2
    cbop-baseline algo=cql preset=debug algo.min_q_weight=10

Same data loading, preset (gradient steps, batch, sizes), evaluation, logging,
checkpointing and ``results.json`` as ``cbop-train``; the run directory is
``runs/<dataset>/<preset>/<algo>/<overrides>`` and re-running the command resumes it.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cbop_torchrl.apps.api import train_baseline
from cbop_torchrl.baselines import BaselineConfigError
from cbop_torchrl.cli import hydra_entry, refuse
from cbop_torchrl.config import ConfigError
from cbop_torchrl.data import DatasetError
from cbop_torchrl.envs import describe_score, filter_env_warnings
from cbop_torchrl.trainers.checkpoint import CheckpointError, NonFiniteLossError


def run(cfg: DictConfig) -> None:
    """The Hydra task: one baseline run in Hydra's run directory."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        results = train_baseline(cfg, run_dir)
    except (
        BaselineConfigError, ConfigError, DatasetError, CheckpointError, NonFiniteLossError
    ) as error:  # fmt: skip
        refuse(error, run_dir)
    print(
        f"[baseline] {results['algo']} on {results['dataset']} (seed {results['seed']}): "
        f"{describe_score(results)} after {results['gradient_steps']} gradient "
        f"steps; {results['wall_time_s']:.0f} s\n[baseline] results: {run_dir / 'results.json'}"
    )


def main() -> None:
    filter_env_warnings()
    # NaN and empty strings: load_config reports them among every other problem.
    hydra_entry("baseline", uses_cache=True, check_values=False)(run)()
