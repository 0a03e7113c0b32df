"""``cbop-train`` (``scripts/cbop.py``): offline CBOP on one dataset, dynamics -> BC -> FQE ->
CBOP, evaluation, results.json.

    cbop-train                               # bundled demo data, CPU preset
    cbop-train env=hopper-medium-replay-v2   # a D4RL id: the paper's settings
    cbop-train env=/path/to/file.hdf5 preset=cpu estimator.psi=1.0
    cbop-train preset=debug logger=tensorboard seed=1
    cbop-train runs.seeds=[0,1,2] runs.psi=[0.5,2,3,5]   # 12 runs side by side, one process

The run directory (``runs/<dataset>/<preset>/<overrides>``) is the same for
the same command, so re-running an interrupted command continues from its
checkpoint; ``resume=false`` starts over, ``resume=true`` insists on one. With a
``runs`` section the run directory holds one directory per run (``psi<P>-seed<S>``),
each resumed the same way (:func:`cbop_torchrl.apps.api.train_side_by_side`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cbop_torchrl.apps.api import config_name, runs_given, train, train_side_by_side
from cbop_torchrl.cli import hydra_entry, refuse
from cbop_torchrl.config import ConfigError
from cbop_torchrl.data import DatasetError
from cbop_torchrl.envs import describe_score, filter_env_warnings
from cbop_torchrl.trainers.checkpoint import CheckpointError, NonFiniteLossError


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


def run(cfg: DictConfig) -> None:
    """The Hydra task: one training run in Hydra's run directory."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        if runs_given(cfg):
            for name, results in train_side_by_side(cfg, run_dir).items():
                print(format_summary(results, run_dir / name))
            return
        results = train(cfg, run_dir)
    except (ConfigError, DatasetError, CheckpointError, NonFiniteLossError) as error:
        refuse(error, run_dir)
    print(format_summary(results, run_dir))


def main() -> None:
    filter_env_warnings()
    # The command line is only read here, never changed: a D4RL id without preset= makes
    # Hydra compose configs/config_paper.yaml (the paper preset) instead of config.yaml.
    # NaN and empty strings: load_config reports them among every other problem.
    hydra_entry(config_name("cbop", sys.argv[1:]), uses_cache=True, check_values=False)(run)()
