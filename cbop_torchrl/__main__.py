"""``python -m cbop_torchrl``: what the package offers on the command line and in Python.

``python -m cbop_torchrl <command> [overrides]`` (e.g. ``python -m cbop_torchrl
cbop-train preset=debug``) runs a program like its console script does, for an
environment where the scripts are not installed (the package on ``PYTHONPATH``).
"""

from __future__ import annotations

import sys
from importlib.resources import files

from cbop_torchrl import __version__
from cbop_torchrl.apps import COMMANDS, launch


def overview() -> str:
    """The text ``python -m cbop_torchrl`` prints."""
    width = max(len(command.name) for command in COMMANDS)
    lines = [
        f"cbop-torchrl {__version__}: CBOP (ICLR 2023) on TorchRL",
        "",
        "Commands (each takes Hydra overrides, e.g. preset=debug seed=1; --help lists them,",
        "--cfg job shows the composed config, -m sweeps):",
    ]
    lines += [f"  {command.name:<{width}}  {command.summary}" for command in COMMANDS]
    lines += [
        "",
        "In a checkout, python scripts/<name>.py runs the same programs:",
        "  " + ", ".join(command.script for command in COMMANDS),
        "Without the console scripts: python -m cbop_torchrl <command> [overrides]",
        "",
        "Python API:",
        "  from cbop_torchrl import compose_config, train, train_baseline, evaluate",
        '  results = train(compose_config(["preset=debug"]), run_dir="runs/api-demo")',
        "",
        f"Configs: {files('cbop_torchrl') / 'configs'}",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Prints :func:`overview`, or runs ``argv[0]`` (a command's name) on ``argv[1:]``."""
    if not argv:
        print(overview())
        return 0
    by_name = {command.name: command for command in COMMANDS}
    if argv[0] not in by_name:
        print(
            f"error: {argv[0]!r} is not a command of cbop-torchrl; the commands are "
            f"{', '.join(by_name)} (python -m cbop_torchrl lists them)",
            file=sys.stderr,
        )
        return 2
    sys.argv = [argv[0], *argv[1:]]  # the program reads its overrides (Hydra) from sys.argv
    return launch(by_name[argv[0]].module) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
