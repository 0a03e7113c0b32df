"""The running process: which program it is, the commands its messages suggest, its seeds,
its device, and MuJoCo's log.

At the bottom of the package with :mod:`cbop_torchrl.io`, so that any layer may name a
program or a setting in a message.
"""

from __future__ import annotations

import enum
import random
import re
import shlex
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

# ---------------------------------------------------------------- which program runs

_running_program: str | None = None


def set_running_program(name: str | None) -> None:
    """Records which of the package's programs this process runs (``cbop-train``, ...).

    Set by :func:`cbop_torchrl.apps.launch` for the console scripts, ``scripts/*.py`` and
    ``python -m cbop_torchrl <command>``; error messages then suggest that program.
    """
    global _running_program
    _running_program = name


def running_program() -> str | None:
    """The program recorded by :func:`set_running_program`; None from Python (API, notebooks)."""
    return _running_program


# ------------------------------------------------------------- commands messages suggest


def program_command(name: str) -> str:
    """How to start the package's program ``name`` (``cbop-collect``) from the user's shell.

    Error messages suggest commands built on it, and a suggestion must work as
    written for a ``pip install`` of the wheel and a checkout set up with
    ``setup.sh`` (an editable install) alike: both put the console script next
    to this Python interpreter. Returns the bare name when the shell finds that
    very script on ``PATH`` (an activated venv), else the script's full path,
    else (the package imported without being installed)
    ``<python> -m cbop_torchrl <name>``.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        found = shutil.which(name)
        if found is not None and Path(found).resolve() == beside.resolve():
            return name
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m cbop_torchrl {name}"


def override_value(text: str) -> str:
    """``text`` as a Hydra override value that Hydra reads back as exactly this string:
    bare when it is a plain word Hydra takes for a string, else single-quoted (a quote
    escaped, and the backslashes before a quote or the closing one doubled; ``${``
    escaped so that it is no interpolation)."""
    if re.fullmatch(r"[\w./~:+@%-]+", text) and not _other_type(text):
        return text
    quoted = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text)
    quoted = quoted.replace("'", "\\'").replace("${", "\\${")
    return f"'{quoted}'"


def _other_type(text: str) -> bool:
    """Whether Hydra reads the bare word ``text`` as something other than that string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(f"k={text}").value() != text
    except Exception:
        return True


def override_word(key: str, value: Any) -> str:
    """``key=value`` as a command-line override that sets exactly ``value`` (a string,
    number, bool, None or a list of them), for the commands messages suggest."""
    return f"{key}={_override_literal(value)}"


def _override_literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_literal(item) for item in value) + "]"
    if isinstance(value, enum.Enum):
        value = value.value
    return override_value(str(value))


# ------------------------------------------------------------------ seeds and devices


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else CPU; ``"cuda"`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise RuntimeError(
            f"device={device!r} is not a device; use auto, cpu, cuda or cuda:<index>."
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} was requested but no CUDA device is available; "
            "use device=cpu or device=auto."
        )
    return resolved


# ------------------------------------------------------------------------- MuJoCo's log


def keep_mujoco_log_out_of_cwd() -> None:
    """Makes MuJoCo's warnings (a deprecated model attribute, an unstable simulation) Python
    warnings (:class:`MuJoCoWarning`). MuJoCo's own handler prints each one to the console
    every time it happens and appends it to ``MUJOCO_LOG.TXT`` in the working directory; a
    halfcheetah run compiles its model once per evaluation environment, thousands of identical
    lines. As Python warnings they show once per message and place, can be filtered, and no
    program of this package writes into the working directory unless told to. Does nothing
    without MuJoCo."""
    import importlib.util

    if importlib.util.find_spec("mujoco") is None:
        return
    import mujoco

    try:
        config = mujoco.MjLogConfig.get()
        config.logto_file = False
        config.set()
    except Exception:  # another MuJoCo version without MjLogConfig: its default stays
        pass
    if hasattr(mujoco, "set_mju_user_warning"):
        mujoco.set_mju_user_warning(_warn_from_mujoco)


class MuJoCoWarning(RuntimeWarning):
    """A warning of the MuJoCo library (its text as MuJoCo gives it)."""


def _warn_from_mujoco(message: str) -> None:
    # stacklevel 2: the Python line that called into MuJoCo (a model load, a step)
    warnings.warn(message.strip(), MuJoCoWarning, stacklevel=2)
