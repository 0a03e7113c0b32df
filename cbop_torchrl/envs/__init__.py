"""Tasks, their gymnasium environments and the deterministic policy evaluator.

Above the data layer (a task is resolved for a dataset and checked against
it) and below the trainers (they evaluate during training); the analysis,
selection and report code in :mod:`cbop_torchrl.evaluation` sits above the
trainers and uses them.
"""

from cbop_torchrl.envs.evaluate import (
    EVALUATION_FORMAT,
    NO_NORMALIZED_SCORE,
    EvalResult,
    PolicyEvaluator,
    describe_score,
    evaluate_policy,
    evaluation_output_problem,
    run_evaluator,
)
from cbop_torchrl.envs.gym import (
    EnvSpecs,
    check_data_fits_env,
    check_sizes_fit_env,
    filter_env_warnings,
    make_env,
    make_eval_env,
    read_env_specs,
)
from cbop_torchrl.envs.task import TaskConfig, TaskError, resolve_task

__all__ = [
    "EVALUATION_FORMAT",
    "NO_NORMALIZED_SCORE",
    "EnvSpecs",
    "EvalResult",
    "PolicyEvaluator",
    "TaskConfig",
    "TaskError",
    "check_data_fits_env",
    "check_sizes_fit_env",
    "describe_score",
    "evaluate_policy",
    "evaluation_output_problem",
    "filter_env_warnings",
    "make_env",
    "make_eval_env",
    "read_env_specs",
    "resolve_task",
    "run_evaluator",
]
