"""Kept for existing imports only: the helpers that lived here are now in
:mod:`cbop_torchrl.io` (the cache, atomic writes, owned outputs, failures of writing) and
:mod:`cbop_torchrl.runtime` (the running program, suggested commands, seeds, devices)."""

from cbop_torchrl.io import *  # noqa: F403
from cbop_torchrl.io import __all__ as _io_names
from cbop_torchrl.runtime import (
    keep_mujoco_log_out_of_cwd,
    override_value,
    override_word,
    program_command,
    resolve_device,
    running_program,
    seed_everything,
    set_running_program,
)

__all__ = [
    *_io_names,
    "keep_mujoco_log_out_of_cwd",
    "override_value",
    "override_word",
    "program_command",
    "resolve_device",
    "running_program",
    "seed_everything",
    "set_running_program",
]
