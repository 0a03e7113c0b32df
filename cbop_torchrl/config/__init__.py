"""The run configuration: typed sections, the paper's settings table, validation.

Hydra composes ``cbop_torchrl/configs/config.yaml`` (a preset, a logger, the dynamics
group) and the command-line overrides into one tree; :func:`load_config`
turns that tree into a :class:`RunConfig` and checks it before any work
starts. Every problem found is reported at once in a :class:`ConfigError`.

Paper settings. A ``null`` in a table-fed field (``estimator.psi``,
``agent.num_qvalue_nets``, ...) means "the paper's value for this dataset":
:func:`paper_settings` supplies it from :data:`PAPER_PSI` and
:data:`PAPER_SHARED` (on a generated look-alike set listed in :data:`GENERATED_PSI`, psi is
the paper's offline choice for that set instead). A D4RL id with no ``preset=`` selects the
paper preset (:func:`cbop_torchrl.cli.wants_paper_preset`).

The modules, one job each:

- :mod:`~cbop_torchrl.config.choices`: every choice's allowed values;
- :mod:`~cbop_torchrl.config.paper`: the paper's settings table and the nulls it fills;
- :mod:`~cbop_torchrl.config.ranges`: a setting's :class:`Range` and the value checks;
- :mod:`~cbop_torchrl.config.sections`: the dataclass sections, each with its ranges and
  checks;
- :mod:`~cbop_torchrl.config.validation`: :data:`SETTING_RANGES` and :func:`validate`;
- :mod:`~cbop_torchrl.config.load`: :func:`load_config`;
- :mod:`~cbop_torchrl.config.runtime`: CPU threads and run directory names.

Every program's Hydra schema is :mod:`cbop_torchrl.cli.schemas`, above the trainers and
baselines whose sections it names.
"""

from __future__ import annotations

from cbop_torchrl.config.choices import (
    ESTIMATOR_MODES,
    EVAL_BACKENDS,
    LOGGER_BACKENDS,
    Q_INITS,
    RESUME_CHOICES,
    Choice,
    Compression,
    DynamicsActivation,
    EstimatorMode,
    EvalBackend,
    FixedWeighting,
    LoggerBackend,
    MediumReference,
    QInit,
    RolloutDtype,
    RolloutExploration,
    Sampling,
    Termination,
    WandbMode,
)
from cbop_torchrl.config.load import ConfigError, DatasetLookup, load_config
from cbop_torchrl.config.paper import (
    GENERATED_PSI,
    PAPER_DEFAULT_QVALUE_NETS,
    PAPER_PSI,
    PAPER_QVALUE_NETS,
    PAPER_SHARED,
    SAME_FILE_AS,
    fill_nulls,
    generated_psi,
    infer_dataset_kind,
    paper_settings,
)
from cbop_torchrl.config.ranges import SEED_RANGE, Range, not_a_number_or_empty
from cbop_torchrl.config.runtime import capped_threads, run_name, usable_cores
from cbop_torchrl.config.sections import (
    LATER_OPT_INS,
    WANDB_PROJECT_FORBIDDEN,
    AgentConfig,
    DynamicsConfig,
    EstimatorConfig,
    EvalConfig,
    FQEConfig,
    LoggerConfig,
    PretrainConfig,
    RunConfig,
    TrainConfig,
)
from cbop_torchrl.config.validation import RANGES, SETTING_RANGES, range_problems, validate

__all__ = [
    "ESTIMATOR_MODES",
    "EVAL_BACKENDS",
    "GENERATED_PSI",
    "LATER_OPT_INS",
    "LOGGER_BACKENDS",
    "PAPER_DEFAULT_QVALUE_NETS",
    "PAPER_PSI",
    "PAPER_QVALUE_NETS",
    "PAPER_SHARED",
    "SAME_FILE_AS",
    "Q_INITS",
    "RANGES",
    "RESUME_CHOICES",
    "SEED_RANGE",
    "SETTING_RANGES",
    "WANDB_PROJECT_FORBIDDEN",
    "AgentConfig",
    "Choice",
    "Compression",
    "ConfigError",
    "DatasetLookup",
    "DynamicsActivation",
    "DynamicsConfig",
    "EstimatorConfig",
    "EstimatorMode",
    "EvalBackend",
    "EvalConfig",
    "FQEConfig",
    "FixedWeighting",
    "LoggerBackend",
    "LoggerConfig",
    "MediumReference",
    "PretrainConfig",
    "QInit",
    "Range",
    "RolloutDtype",
    "RolloutExploration",
    "RunConfig",
    "Sampling",
    "Termination",
    "TrainConfig",
    "WandbMode",
    "capped_threads",
    "fill_nulls",
    "generated_psi",
    "infer_dataset_kind",
    "load_config",
    "not_a_number_or_empty",
    "paper_settings",
    "range_problems",
    "run_name",
    "usable_cores",
    "validate",
]
