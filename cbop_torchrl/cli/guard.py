"""Nothing is written into a folder another program made before the check: a Hydra callback.

Every program's config lists :class:`RunDirGuard` under ``hydra.callbacks``. Hydra calls it
once the command's config is composed and before it creates the run directory, sets up its
logging or writes anything: there the guard refuses (exit 2, one paragraph)

- a setting that would make Hydra write into the run directory before the program knows
  the folder is its own: ``hydra.output_subdir`` (the training programs write Hydra's
  ``.hydra/`` record themselves once the directory is claimed,
  :func:`cbop_torchrl.trainers.rundir.claim_run_dir`) or a job logging with a log file;
- for the training programs (whose run directory is their output), a run directory
  another program made (:func:`cbop_torchrl.trainers.rundir.foreign_files`: any file and
  no ``.cbop-run`` marker, another Hydra application's ``.hydra/`` and log included);

and records whether the run directory existed, so a refused command removes only a folder
it made itself (:func:`cbop_torchrl.cli.entry.remove_if_only_hydra_files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

RUN_DIR_CONFIGS = ("config", "config_paper", "baseline")
"""The programs whose Hydra run directory is their output (``cbop-train``, ``cbop-baseline``)."""


def hydra_writes(config: DictConfig) -> list[str]:
    """The settings of ``config`` under which Hydra itself would write into the job's folder
    before the program runs: ``hydra.output_subdir`` set, a job log file."""
    found = []
    subdir = OmegaConf.select(config, "hydra.output_subdir")
    if subdir is not None:
        found.append(
            f"hydra.output_subdir={subdir} (Hydra would write its record there; the training "
            "programs write .hydra/ themselves once the run directory is known to be theirs)"
        )
    handlers = OmegaConf.select(config, "hydra.job_logging.handlers") or {}
    files = [name for name, handler in handlers.items() if "filename" in (handler or {})]
    if files:
        choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
        found.append(
            f"hydra/job_logging={choices.get('hydra/job_logging', '...')} (it writes a log "
            f"file: handler {', '.join(files)})"
        )
    return found


class RunDirGuard(Callback):
    """Hydra's callback of every program: the checks no write of Hydra's may precede."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # resolves ${hydra:...} in the run dir
        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        self.refuse_hydra_writes(config, run_dir)
        name = str(OmegaConf.select(config, "hydra.job.config_name") or "")
        if name.startswith("config_paper") or name in RUN_DIR_CONFIGS:
            from cbop_torchrl.trainers.rundir import foreign_files, foreign_run_dir_error

            if foreign := foreign_files(run_dir):
                _refuse(foreign_run_dir_error(run_dir, foreign))
        from cbop_torchrl.trainers.rundir import note_run_dir

        note_run_dir(run_dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Each job's folder is made by the launcher; Hydra writes nothing into it, and the
        # run checks it (claim_run_dir) before writing anything. Into the sweep folder itself
        # Hydra writes its multirun.yaml next: one another application's sweep left there
        # would be overwritten.
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        self.refuse_hydra_writes(config, sweep_dir)
        ours = str(OmegaConf.select(config, "hydra.job.config_name") or "")
        if (theirs := sweep_owner(sweep_dir)) is not None and theirs != ours:
            _refuse(
                f"the sweep folder {str(sweep_dir)!r} holds another application's sweep "
                f"(its multirun.yaml was written by the config {theirs!r}, this program's is "
                f"{ours!r}), and Hydra would overwrite its record. Give this sweep a folder of "
                "its own: hydra.sweep.dir=<a new or empty folder>."
            )

    @staticmethod
    def refuse_hydra_writes(config: DictConfig, where: Path) -> None:
        if found := hydra_writes(config):
            _refuse(
                f"{'; '.join(found)}: Hydra would write into {str(where)!r} before this "
                "program has checked that the folder is its own, and a folder another "
                "program made must stay as it was. Leave these settings out (the programs "
                "print to the console; a run's logs are under <run>/logs)."
            )


def sweep_owner(sweep_dir: Path) -> str | None:
    """The config name recorded in ``sweep_dir/multirun.yaml`` ("" when it names none), or
    None where there is no such regular file."""
    record = sweep_dir / "multirun.yaml"
    if not record.is_file():
        return None
    try:
        return str(OmegaConf.select(OmegaConf.load(record), "hydra.job.config_name") or "")
    except Exception:  # unreadable as a Hydra record: not ours either
        return ""


def _refuse(message: object) -> None:
    from cbop_torchrl.cli.entry import refuse

    refuse(message)
