"""``cbop-evaluate`` (``scripts/evaluate.py``): evaluates a saved policy and prints its
normalized score (or its return).

    cbop-evaluate checkpoint=runs/demo/cpu/default/policy.pt
    cbop-evaluate checkpoint=runs/.../checkpoint.pt episodes=20 seed=1
    cbop-evaluate checkpoint=.../policy.pt task.ref_min_score=0 task.ref_max_score=360

N deterministic episodes run side by side in a vectorized TorchRL
environment of the policy's task (recorded in the checkpoint); ``task.*``
values given on the command line replace the recorded ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from cbop_torchrl.apps.api import evaluate
from cbop_torchrl.cli import check_output_writable, hydra_entry, refuse
from cbop_torchrl.config import ConfigError
from cbop_torchrl.envs import TaskError, describe_score, filter_env_warnings
from cbop_torchrl.trainers.checkpoint import CheckpointError


def validate(cfg: DictConfig) -> None:
    """Refuses (exit 2) before any work an ``output=`` that cannot be written."""
    if cfg.output:
        check_output_writable("output", cfg.output, Path(cfg.output).absolute().parent)


def run(cfg: DictConfig) -> None:
    """The Hydra task: evaluate, print the returns and the score."""
    try:
        summary = evaluate(cfg)
    except (ConfigError, CheckpointError, TaskError, RuntimeError) as error:
        refuse(error)
    print(json.dumps({k: summary[k] for k in ("dataset", "step", "returns")}))
    print(
        f"{summary['dataset']} policy at step {summary['step']} on {summary['task']['gym_id']}: "
        f"{describe_score(summary)}"
    )


def main() -> None:
    filter_env_warnings()
    hydra_entry("evaluate", validate=validate)(run)()
