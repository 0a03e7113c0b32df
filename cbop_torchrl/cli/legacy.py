"""The command lines of the programs' old argparse syntax, translated to ``key=value``.

Deprecated: the translation is removed in 0.3.0; from then on such a command line gets
Hydra's own refusal. ``cbop-select-psi`` and ``cbop-report`` took bare paths and ``--flag``
options before they took Hydra overrides; :func:`refuse_old_arguments` refuses such a
command line (exit 2) and prints the same command in the new syntax.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Mapping, Sequence

from cbop_torchrl.cli.entry import refuse
from cbop_torchrl.config.schemas import config_file
from cbop_torchrl.utils import override_value, program_command

REMOVED_IN = "0.3.0"
"""The version without the old syntax's translation."""


HYDRA_FLAGS_WITH_VALUE = frozenset(
    ("--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun")
)  # fmt: skip
"""Hydra's command-line flags that take the next word as their value."""


def translate_old_arguments(
    argv: Sequence[str], positional: str, options: Mapping[str, str]
) -> list[str] | None:
    """Hydra overrides for a command line in the argparse syntax a program had before.

    ``positional``: the key the positional arguments become (``sweep_dir``; a
    list ``[a,b]`` when there are several); ``options``: ``--flag`` -> the key it sets, or
    ``key=value`` for a flag without a value (``--no-progress`` ->
    ``progress=false``). Returns None when ``argv`` has nothing in the old
    syntax; Hydra's own flags and ``key=value`` words are kept as they are.
    """
    words: list[str] = []
    paths: list[str] = []
    changed = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        name, equals, value = arg.partition("=")
        if arg in HYDRA_FLAGS_WITH_VALUE:
            words.append(arg)
            if index < len(argv) and "=" not in argv[index] and not argv[index].startswith("-"):
                words.append(argv[index])
                index += 1
        elif name in options:
            changed = True
            if "=" in options[name]:
                words.append(options[name])
                continue
            if not equals and index < len(argv):
                value = argv[index]
                index += 1
            words.append(f"{options[name]}={override_value(value)}")
        elif not arg.startswith("-") and not equals:
            changed = True
            paths.append(arg)
        else:
            words.append(arg)
    if not changed:
        return None
    if paths:
        values = [override_value(path) for path in paths]
        joined = values[0] if len(values) == 1 else f"[{','.join(values)}]"
        words.insert(0, f"{positional}={joined}")
    return words


def refuse_old_arguments(
    argv: Sequence[str],
    program: str,
    config_name: str,
    positional: str,
    options: Mapping[str, str],
) -> None:
    """Refuses (exit 2) a command line in the program's old argparse syntax, printing the
    same command in ``key=value`` overrides (:func:`translate_old_arguments`).

    Deprecated (removed in 0.3.0): warns with a :class:`DeprecationWarning` when it translates.
    """
    translated = translate_old_arguments(argv, positional, options)
    if translated is None:
        return
    warnings.warn(
        f"the legacy --flag syntax of {program} is deprecated; its translation to key=value "
        f"settings will be removed in {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=2,
    )
    refuse(
        f"{program} takes key=value settings (Hydra overrides), not bare paths and --options; "
        f"the same command: {program_command(program)} {shlex.join(translated)}. Every "
        f"setting and its meaning: {config_file(config_name)}"
    )
