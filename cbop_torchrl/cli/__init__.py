"""Entry points: Hydra's main with exit codes, rephrased errors, the fast ``--help``.

- :mod:`~cbop_torchrl.cli.entry`: :func:`hydra_entry` (exit code 2 for bad input, 130 for
  Ctrl-C), the checks before any work (writable folders, ranges), :func:`run_entry`;
- :mod:`~cbop_torchrl.cli.errors`: Hydra's, OmegaConf's and YAML's errors in one paragraph;
- :mod:`~cbop_torchrl.cli.help`: the programs' ``--help`` without Hydra's slow path;
- :mod:`~cbop_torchrl.cli.schemas`: every program's typed config schema, its names
  re-exported here, where the programs import them from.
"""

from __future__ import annotations

from cbop_torchrl.cli.entry import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    OUTPUT_SETTINGS,
    RESUMABLE_CONFIGS,
    check_cache_writable,
    check_output_writable,
    hydra_entry,
    interrupted,
    raised_while_interrupted,
    refuse,
    refuse_known_failure,
    remove_if_only_hydra_files,
    resolve_progress,
    run_entry,
    wants_paper_preset,
)
from cbop_torchrl.cli.errors import (
    describe_hydra_error,
    describe_interpolation_error,
    describe_type,
    describe_yaml_error,
)
from cbop_torchrl.cli.help import help_arguments, print_help, template_variables
from cbop_torchrl.cli.schemas import (
    CONFIG_DIR,
    CONFIG_SCHEMAS,
    PAPER_DATASET_CONFIG,
    SCHEMAS,
    BaselineRunConfig,
    CollectConfig,
    DynamicsSchema,
    EvaluateConfig,
    ReportConfig,
    RunSchema,
    SelectPsiConfig,
    TrainDynamicsConfig,
    TrainDynamicsSchema,
    base_config_name,
    config_file,
    config_values,
    paper_dataset_config,
    register_schemas,
    unknown_keys,
)
from cbop_torchrl.config.choices import Compression, MediumReference, RolloutExploration

__all__ = [
    "CONFIG_DIR",
    "CONFIG_SCHEMAS",
    "EXIT_BAD_INPUT",
    "EXIT_INTERRUPTED",
    "OUTPUT_SETTINGS",
    "PAPER_DATASET_CONFIG",
    "RESUMABLE_CONFIGS",
    "SCHEMAS",
    "BaselineRunConfig",
    "CollectConfig",
    "Compression",
    "DynamicsSchema",
    "EvaluateConfig",
    "MediumReference",
    "ReportConfig",
    "RolloutExploration",
    "RunSchema",
    "SelectPsiConfig",
    "TrainDynamicsConfig",
    "TrainDynamicsSchema",
    "base_config_name",
    "check_cache_writable",
    "check_output_writable",
    "config_file",
    "config_values",
    "describe_hydra_error",
    "describe_interpolation_error",
    "describe_type",
    "describe_yaml_error",
    "help_arguments",
    "hydra_entry",
    "interrupted",
    "paper_dataset_config",
    "print_help",
    "raised_while_interrupted",
    "refuse",
    "refuse_known_failure",
    "register_schemas",
    "remove_if_only_hydra_files",
    "resolve_progress",
    "run_entry",
    "template_variables",
    "unknown_keys",
    "wants_paper_preset",
]
