"""Offline CBOP on one dataset: dynamics -> BC -> FQE -> CBOP, evaluation, results.json.

    python scripts/cbop.py                               # bundled demo data, CPU preset
    python scripts/cbop.py env=hopper-medium-replay-v2   # a D4RL id: the paper's settings
    python scripts/cbop.py env=/path/to/file.hdf5 preset=cpu estimator.psi=1.0
    python scripts/cbop.py preset=debug logger=tensorboard seed=1

The run directory (``runs/<dataset>/<preset>/<overrides>``) is the same for
the same command, so re-running an interrupted command continues from its
checkpoint; ``resume=false`` starts over, ``resume=true`` insists on one.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a busy machine (more runnable processes
# than cores) spinning threads slow every small matmul down by up to 10x. Read by torch at
# import, so it is set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys
import warnings
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cbop_torchrl.cli import config_values, hydra_entry, refuse, wants_paper_preset
from cbop_torchrl.config import ConfigError, load_config
from cbop_torchrl.data import DatasetError, load_dataset_with_info
from cbop_torchrl.envs import describe_score, filter_env_warnings
from cbop_torchrl.trainers.checkpoint import CheckpointError, NonFiniteLossError
from cbop_torchrl.trainers.offline import run_pipeline


def format_summary(results: dict, run_dir: Path) -> str:
    """The closing lines printed after a run."""
    horizon = ""
    if results.get("expected_horizon_start") is not None:
        horizon = (
            f", E[h] {results['expected_horizon_start']:.2f} -> "
            f"{results['expected_horizon_end']:.2f}"
        )
    return (
        f"[cbop] {results['dataset']} (seed {results['seed']}): {describe_score(results)} after "
        f"{results['gradient_steps']} gradient steps{horizon}; "
        f"{results['wall_time_s']:.0f} s\n[cbop] results: {run_dir / 'results.json'}"
    )


# A D4RL id without preset= trains with the paper's settings (configs/config_paper.yaml).
@hydra_entry("config_paper" if wants_paper_preset(sys.argv[1:]) else "config")
def main(cfg: DictConfig) -> None:
    values = config_values(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    loaded = {}

    def lookup_dataset(env: str):
        loaded["data"], loaded["info"] = load_dataset_with_info(env)
        return loaded["info"].family, loaded["info"].name

    try:
        config, filled = load_config(values, lookup_dataset)
        if config.progress and filled:
            print(f"[cbop] paper settings for {loaded['info'].name}: {', '.join(filled)}")
        results = run_pipeline(config, loaded["info"], loaded["data"], run_dir)
    except (ConfigError, DatasetError, CheckpointError, NonFiniteLossError) as error:
        refuse(error, run_dir)
    print(format_summary(results, run_dir))


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message=".*compiled extension.*")
    filter_env_warnings()
    main()
