"""A model-free offline baseline (BC, TD3+BC, IQL, CQL) on one dataset, CBOP's run format.

    python scripts/baseline.py algo=td3bc                       # bundled demo data, CPU preset
    python scripts/baseline.py algo=iql env=/data/hopper-medium-replay-gen.hdf5 seed=2
    python scripts/baseline.py algo=cql preset=debug algo.min_q_weight=10

Same data loading, preset (gradient steps, batch, sizes), evaluation, logging,
checkpointing and ``results.json`` as ``scripts/cbop.py``; the run directory is
``runs/<dataset>/<preset>/<algo>/<overrides>`` and re-running the command resumes it.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning (as in scripts/cbop.py): on a busy machine
# spinning threads slow every small matmul down by up to 10x. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import warnings
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cbop_torchrl.baselines import AlgoConfig, BaselineConfigError, run_baseline
from cbop_torchrl.cli import config_values, hydra_entry, refuse
from cbop_torchrl.config import ConfigError, load_config
from cbop_torchrl.data import DatasetError, load_dataset_with_info
from cbop_torchrl.envs import describe_score, filter_env_warnings
from cbop_torchrl.trainers.checkpoint import CheckpointError, NonFiniteLossError


@hydra_entry("baseline")
def main(cfg: DictConfig) -> None:
    values = config_values(cfg)
    algo_values = values.pop("algo")
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    loaded = {}

    def lookup_dataset(env: str):
        loaded["data"], loaded["info"] = load_dataset_with_info(env)
        return loaded["info"].family, loaded["info"].name

    # psi is CBOP's; a null would ask the paper table for it, which knows D4RL names only.
    if values.get("estimator", {}).get("psi") is None:
        values.setdefault("estimator", {})["psi"] = 0.0
    try:
        algo = AlgoConfig.from_dict(algo_values)
        config, _ = load_config(values, lookup_dataset)
        results = run_baseline(config, algo, loaded["info"], loaded["data"], run_dir)
    except (
        BaselineConfigError, ConfigError, DatasetError, CheckpointError, NonFiniteLossError
    ) as error:  # fmt: skip
        refuse(error, run_dir)
    print(
        f"[baseline] {results['algo']} on {results['dataset']} (seed {results['seed']}): "
        f"{describe_score(results)} after {results['gradient_steps']} gradient "
        f"steps; {results['wall_time_s']:.0f} s\n[baseline] results: {run_dir / 'results.json'}"
    )


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message=".*compiled extension.*")
    filter_env_warnings()
    main()
