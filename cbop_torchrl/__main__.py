"""``python -m cbop_torchrl``: what the package offers on the command line and in Python."""

from __future__ import annotations

from importlib.resources import files

from cbop_torchrl import __version__
from cbop_torchrl.apps import COMMANDS


def overview() -> str:
    """The text ``python -m cbop_torchrl`` prints."""
    width = max(len(command.name) for command in COMMANDS)
    lines = [
        f"cbop-torchrl {__version__}: CBOP (ICLR 2023) on TorchRL",
        "",
        "Commands (each takes Hydra overrides, e.g. preset=debug seed=1; --help lists them;",
        "cbop-select-psi and cbop-report take paths and --options instead):",
    ]
    lines += [f"  {command.name:<{width}}  {command.summary}" for command in COMMANDS]
    lines += [
        "",
        "In a checkout, python scripts/<name>.py runs the same programs:",
        "  " + ", ".join(command.script for command in COMMANDS),
        "",
        "Python API:",
        "  from cbop_torchrl import compose_config, train, train_baseline, evaluate",
        '  results = train(compose_config(["preset=debug"]), run_dir="runs/api-demo")',
        "",
        f"Configs: {files('cbop_torchrl') / 'configs'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(overview())
