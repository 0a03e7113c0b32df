"""Evaluates a saved CBOP policy and prints its D4RL normalized score.

    python scripts/evaluate.py checkpoint=runs/demo/cpu/default/policy.pt
    python scripts/evaluate.py checkpoint=runs/.../checkpoint.pt episodes=20 seed=1

N deterministic episodes run side by side in a vectorized TorchRL
environment of the policy's family (recorded in the checkpoint).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning (see scripts/cbop.py); set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import sys
import warnings

import hydra
from omegaconf import DictConfig

from cbop_torchrl.envs.evaluate import (
    evaluate_policy,
    filter_env_warnings,
    make_eval_env,
)
from cbop_torchrl.trainers.checkpoint import CheckpointError, load_policy
from cbop_torchrl.utils import atomic_json_dump, resolve_device


@hydra.main(config_path="../configs", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.episodes < 1 or cfg.max_steps < 1:
        print("error: episodes and max_steps must be positive integers", file=sys.stderr)
        sys.exit(2)
    try:
        actor, family, meta = load_policy(cfg.checkpoint, resolve_device(cfg.device))
    except (CheckpointError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    env = make_eval_env(family, cfg.episodes, cfg.backend)
    try:
        result = evaluate_policy(actor, family, env, cfg.max_steps, cfg.seed)
    finally:
        env.close()
    summary = {"checkpoint": str(cfg.checkpoint), **meta, **result.summary()}
    if cfg.output:
        atomic_json_dump(summary, cfg.output)
    print(json.dumps({k: summary[k] for k in ("dataset", "step", "returns")}))
    print(
        f"{meta['dataset']} policy at step {meta['step']} on {family.gym_id}: normalized score "
        f"{result.normalized_score_mean:.1f} +- {result.normalized_score_std:.1f} "
        f"(return {result.return_mean:.1f} over {cfg.episodes} episodes)"
    )


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message=".*compiled extension.*")
    filter_env_warnings()
    main()
