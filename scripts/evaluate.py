"""Evaluates a saved policy and prints its normalized score (or its return).

    python scripts/evaluate.py checkpoint=runs/demo/cpu/default/policy.pt
    python scripts/evaluate.py checkpoint=runs/.../checkpoint.pt episodes=20 seed=1
    python scripts/evaluate.py checkpoint=.../policy.pt task.ref_min_score=0 task.ref_max_score=360

N deterministic episodes run side by side in a vectorized TorchRL
environment of the policy's task (recorded in the checkpoint); ``task.*``
values given on the command line replace the recorded ones.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning (see scripts/cbop.py); set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import sys
import warnings

from omegaconf import DictConfig, OmegaConf

from cbop_torchrl.cli import hydra_entry
from cbop_torchrl.envs import (
    TaskError,
    check_sizes_fit_env,
    describe_score,
    evaluate_policy,
    filter_env_warnings,
    make_eval_env,
    read_env_specs,
)
from cbop_torchrl.envs.task import override_task
from cbop_torchrl.trainers.checkpoint import CheckpointError, load_policy
from cbop_torchrl.utils import atomic_json_dump, resolve_device


@hydra_entry("evaluate")
def main(cfg: DictConfig) -> None:
    if cfg.episodes < 1 or cfg.max_steps < 1:
        print("error: episodes and max_steps must be positive integers", file=sys.stderr)
        sys.exit(2)
    try:
        actor, recorded, meta = load_policy(cfg.checkpoint, resolve_device(cfg.device))
        task = override_task(recorded, OmegaConf.to_container(cfg.task, resolve=True))
        specs = read_env_specs(task)
        what = f"the policy {str(cfg.checkpoint)!r}"
        check_sizes_fit_env(what, meta["obs_dim"], meta["action_dim"], specs, task)
    except (CheckpointError, TaskError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    env = make_eval_env(task, cfg.episodes, cfg.backend)
    try:
        result = evaluate_policy(actor, task, env, cfg.max_steps, cfg.seed)
    finally:
        env.close()
    summary = {
        "checkpoint": str(cfg.checkpoint),
        **meta,
        "task": task.to_dict(),
        **result.summary(),
    }
    if cfg.output:
        atomic_json_dump(summary, cfg.output)
    print(json.dumps({k: summary[k] for k in ("dataset", "step", "returns")}))
    print(
        f"{meta['dataset']} policy at step {meta['step']} on {task.gym_id}: "
        f"{describe_score(summary)}"
    )


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message=".*compiled extension.*")
    filter_env_warnings()
    main()
