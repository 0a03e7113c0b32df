"""Evaluation environments and the deterministic policy evaluator.

Below the trainers (they evaluate during training) and above the data layer;
the analysis, selection and report code in :mod:`cbop_torchrl.evaluation`
sits above the trainers and uses them.
"""

from cbop_torchrl.envs.evaluate import (
    EvalResult,
    episode_returns,
    evaluate_policy,
    filter_env_warnings,
    make_eval_env,
)

__all__ = [
    "EvalResult",
    "episode_returns",
    "evaluate_policy",
    "filter_env_warnings",
    "make_eval_env",
]
