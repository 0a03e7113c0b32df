"""Reading a sweep directory: the runs it holds and their ``results.json``.

A Hydra multirun of ``scripts/cbop.py`` writes one run directory per job
under ``hydra.sweep.dir`` (``<dataset>/<preset>/<overrides>``, see
``cbop_torchrl/configs/config.yaml``). Each finished run holds ``results.json``,
``config.json``, ``policy.pt`` and ``checkpoint.pt``; a run still training
(or preempted) has ``config.json`` and ``checkpoint.pt`` only. Runs are
found by these files, so hand-made layouts (a directory of ``hydra.run.dir``
runs, or of symbolic links to runs kept elsewhere) work as well.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cbop_torchrl.io import is_regular_file, read_json_object, read_regular_text
from cbop_torchrl.io.walking import find_regular_files, is_system_folder

RESULTS_NAME = "results.json"
CONFIG_NAME = "config.json"
POLICY_FILES = ("policy.pt", "checkpoint.pt")
"""Where a run's actor is stored, in order of preference (final policy first)."""


class SweepError(ValueError):
    """A sweep directory is missing, empty or holds unreadable run files."""


def check_search_root(path: str | Path, key: str) -> None:
    """Refuses (:class:`SweepError`) a folder no program should search: the root of the file
    system (every folder of the machine, every other user's runs) or the kernel's
    :data:`cbop_torchrl.io.walking.SYSTEM_FOLDERS`."""
    real = os.path.realpath(path)
    if real == "/" or is_system_folder(real):
        raise SweepError(
            f"{key}={path} would search {'the whole file system' if real == '/' else real!r}; "
            "give the folder of your runs (the hydra.sweep.dir of a multirun, a run directory, "
            "or a folder of benchmark summaries)"
        )


def _check_dir(sweep_dir: Path) -> None:
    check_search_root(sweep_dir, "sweep_dir")
    if not sweep_dir.is_dir():
        raise SweepError(
            f"sweep directory {str(sweep_dir)!r} does not exist or is not a directory; give the "
            "hydra.sweep.dir of a multirun (e.g. sweep_dir=multirun or sweep_dir=sweeps/paper_grid)"
        )


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object of a run file; :class:`SweepError` when it is unreadable or no object."""
    return read_json_object(
        path,
        SweepError,
        "the pipeline writes it atomically, so the file was edited or copied partially: "
        "delete it and re-run that job (the same command resumes it)",
    )


def read_overrides(run_dir: str | Path) -> list[str] | None:
    """The Hydra overrides a job ran with (``.hydra/overrides.yaml``), or None."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not is_regular_file(path):
        return None
    from omegaconf import OmegaConf  # Hydra's own reader; omegaconf ships with hydra-core

    return [str(item) for item in OmegaConf.create(read_regular_text(path))]


def find_runs(sweep_dir: str | Path) -> list[Path]:
    """Run directories under ``sweep_dir`` that hold a trained actor, sorted.

    A run counts when it has ``config.json`` and ``policy.pt`` or
    ``checkpoint.pt`` (:data:`POLICY_FILES`).

    Raises:
        SweepError: ``sweep_dir`` is not a directory.
    """
    sweep_dir = Path(sweep_dir)
    _check_dir(sweep_dir)
    runs = []
    for config in find_regular_files(sweep_dir, CONFIG_NAME):
        if any(is_regular_file(config.parent / name) for name in POLICY_FILES):
            runs.append(config.parent)
    return runs


def policy_file(run_dir: str | Path) -> Path:
    """The run's final ``policy.pt``, or its ``checkpoint.pt`` while it is still training."""
    for name in POLICY_FILES:
        path = Path(run_dir) / name
        if is_regular_file(path):
            return path
    raise SweepError(f"run directory {str(run_dir)!r} holds neither {' nor '.join(POLICY_FILES)}")


def read_run(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A run's ``config.json`` and its ``results.json`` (None when it has not finished)."""
    run_dir = Path(run_dir)
    config = _read_json(run_dir / CONFIG_NAME)
    results_path = run_dir / RESULTS_NAME
    return config, (_read_json(results_path) if is_regular_file(results_path) else None)


__all__ = [
    "SweepError",
    "find_runs",
    "policy_file",
    "read_overrides",
    "read_run",
]
