"""The programs' ``--help``, printed by the entry point instead of Hydra.

Hydra's own --help (``Hydra.app_help``) fills every variable of the help template, and for
$APP_CONFIG_GROUPS and $HYDRA_CONFIG_GROUPS it lists each config group's options, which
deep-copies its config repository once per group: about 13 s per --help on the 2-core
development machine, although the programs' templates (``hydra.help.template`` in
configs/*.yaml) use only $CONFIG. So the entry point composes the config and prints the
template itself, as ``app_help`` does; a template that names any other variable still gets
Hydra's path.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import string
from collections.abc import Callable, Sequence
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, flag_override

from cbop_torchrl.cli.schemas import CONFIG_DIR


def help_arguments(argv: Sequence[str]) -> argparse.Namespace | None:
    """Hydra's reading of ``argv`` when it asks for the program's ``--help`` (``-h``) with the
    program's own config, else None (also for a command line Hydra refuses: Hydra reports it)."""
    if not any(word.startswith("-") for word in argv):
        return None
    from hydra._internal.utils import get_args_parser  # the parser of hydra.main

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return None
    own_config = args.config_path is None and args.config_name is None and args.config_dir is None
    if args.help and not args.hydra_help and args.experimental_rerun is None and own_config:
        return args
    return None


def template_variables(template: string.Template) -> set[str] | None:
    """The ``$NAME`` variables ``template`` uses; None when it has a ``$`` that is not valid."""
    names: set[str] = set()
    for match in template.pattern.finditer(template.template):
        if match["invalid"] is not None:
            return None
        if name := match["named"] or match["braced"]:
            names.add(name)
    return names


def print_help(config_name: str, task: Callable[..., Any], args: argparse.Namespace) -> bool:
    """Prints the program's ``--help`` as ``hydra.main`` would (``Hydra.app_help``: the same
    composition, overrides and ``--resolve``); False, printing nothing, when the help
    template uses more than ``$CONFIG`` (left to Hydra then)."""
    from hydra._internal.utils import (
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
    )
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    job_name = detect_task_name(*detect_calling_file_or_module_from_task_function(task))
    with hydra.initialize_config_dir(str(CONFIG_DIR), job_name=job_name, version_base="1.3"):
        cfg = GlobalHydra.instance().hydra.compose_config(  # as app_help composes it
            config_name, args.overrides, run_mode=RunMode.RUN, with_log_configuration=True
        )
        template = string.Template(cfg.hydra.help.template)
        if template_variables(template) not in ({"CONFIG"}, set()):
            return False
        HydraConfig.instance().set_config(cfg)
        job = copy.deepcopy(cfg)
        with flag_override(job, ["struct", "readonly"], [False, False]):
            del job["hydra"]
        print(template.substitute(CONFIG=OmegaConf.to_yaml(job, resolve=args.resolve)))
    return True
