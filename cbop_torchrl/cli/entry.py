"""The programs' entry point: Hydra's main with this package's exit codes.

:func:`hydra_entry` wraps a program's task function in ``hydra.main``. An error Hydra
raises before the task function starts is bad input: one paragraph
(:func:`cbop_torchrl.cli.errors.describe_hydra_error`: the key, what it takes, an example)
and exit code 2 instead of Hydra's multi-line report and exit code 1. Before the task, the
composed config is checked (no key added with ``+``, no missing value, every number in its
range) and the places the program writes are checked to be writable; Ctrl-C ends with one
line saying how to go on and exit code 130.
"""

from __future__ import annotations

import copy
import functools
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from cbop_torchrl.cli.errors import describe_hydra_error, describe_interpolation_error
from cbop_torchrl.cli.help import help_arguments, print_help
from cbop_torchrl.cli.schemas import (
    CONFIG_DIR,
    CONFIG_SCHEMAS,
    base_config_name,
    config_file,
    config_values,
    register_schemas,
    unknown_keys,
)
from cbop_torchrl.config import capped_threads, not_a_number_or_empty, range_problems
from cbop_torchrl.io import (
    ForeignFileError,
    cache_root,
    is_out_of_memory,
    out_of_memory_message,
    set_output_setting,
    unwritable_reason,
    write_failure,
)
from cbop_torchrl.registry import parse_d4rl_id
from cbop_torchrl.runtime import keep_mujoco_log_out_of_cwd, program_command, running_program
from cbop_torchrl.trainers.logging import ProgressLines
from cbop_torchrl.trainers.rundir import (
    LOCK_NAME,
    MARKER_NAME,
    existing_ancestor,
    remember_hydra_job,
)

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a process stopped by Ctrl-C
RESUMABLE_CONFIGS = frozenset(("config", "config_paper", "baseline"))
"""The programs whose interrupted run continues where it stopped when run again."""


def refuse(message: object, created_dir: str | Path | None = None) -> NoReturn:
    """Prints ``error: <message>`` and exits with code 2 (bad input).

    ``created_dir``: a run directory Hydra made for this command; removed (with
    parents that become empty, up to the working directory) when it holds
    nothing but Hydra's own files, so a refused command leaves nothing behind.
    """
    print(f"error: {message}", file=sys.stderr)
    if created_dir is not None:
        remove_if_only_hydra_files(Path(created_dir))
    sys.exit(EXIT_BAD_INPUT)


def remove_if_only_hydra_files(run_dir: Path) -> None:
    """Removes ``run_dir`` if this command made it and it holds only what this command put
    there, then the empty parents it made.

    A folder that existed before the command (recorded by the guard,
    :mod:`cbop_torchrl.cli.guard`), the run directory or a parent, is never removed.
    Otherwise (made now, or a multirun's job folder, made by Hydra's launcher) it may hold
    the run marker (``.cbop-run``), the ``.hydra/`` record the run writes after it, and a
    run lock (``.run.lock``) that is free or held by this process; a lock naming another
    process or any other file belongs to another run and keeps the directory.
    """
    run_dir = run_dir.resolve()
    if not run_dir.is_dir() or run_dir == Path.cwd().resolve():
        return
    kept = existing_ancestor(run_dir)  # what existed before the command stays
    if kept == run_dir:
        return
    names = {path.name for path in run_dir.iterdir()}
    if names - {MARKER_NAME, LOCK_NAME, *((".hydra",) if MARKER_NAME in names else ())}:
        return
    if LOCK_NAME in names:
        holder = (run_dir / LOCK_NAME).read_text().strip()
        if holder and not holder.startswith(f"pid {os.getpid()} "):
            return
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = run_dir.parent
    while parent not in (cwd, kept) and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def check_cache_writable(created_dir: str | Path | None = None) -> None:
    """Refuses (exit 2) when the cache root (``$CBOP_TORCHRL_CACHE``) cannot be created or written.

    Checked before any work, so a read-only cache is not found by a stage minutes in.
    ``created_dir``: as in :func:`refuse`.
    """
    root = cache_root()
    reason = unwritable_reason(root)
    if reason is not None:
        source = "$CBOP_TORCHRL_CACHE" if "CBOP_TORCHRL_CACHE" in os.environ else "the default"
        refuse(
            f"the cache directory {str(root)!r} ({source}) is not writable: {reason}. Point "
            "CBOP_TORCHRL_CACHE at a directory you can write to, e.g. "
            "CBOP_TORCHRL_CACHE=/tmp/cbop_cache",
            created_dir,
        )


def check_output_writable(
    key: str,
    value: str | Path,
    directory: str | Path | None = None,
    created_dir: str | Path | None = None,
) -> None:
    """Refuses (exit 2) when the output ``key=value`` cannot be written.

    ``directory``: the directory to create or write into (default: ``value`` itself;
    for an output file, its parent). ``created_dir``: as in :func:`refuse`.
    """
    reason = unwritable_reason(value if directory is None else directory)
    if reason is not None:
        refuse(
            f"{key}={value} cannot be written: {reason}; set {key}= to a path in a "
            "directory you can write to",
            created_dir,
        )


def wants_paper_preset(overrides: Sequence[str]) -> bool:
    """Whether command-line overrides name only D4RL ids in ``env=`` and no ``preset=``.

    ``python scripts/cbop.py env=hopper-medium-v2`` trains with the paper's
    settings. Hydra cannot choose a config group from a plain field's value,
    so the entry point chooses its primary config instead (``config_paper``,
    which is ``config`` with ``override preset: paper``); the command line
    itself is passed to Hydra untouched, so ``--cfg job``, ``--help`` and
    ``-m`` keep working.
    """
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "preset":
            return False
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key == "env" and value:
            return all(parse_d4rl_id(item) is not None for item in value.split(","))
    return False


def _sweep_dir(argv: Sequence[str]) -> Path | None:
    """The sweep directory a ``-m`` command line makes (``hydra.sweep.dir``, default
    ``multirun`` as in the configs), or None without ``-m``."""
    if not {"-m", "--multirun"} & set(argv):
        return None
    given = [arg.partition("=")[2] for arg in argv if arg.startswith("hydra.sweep.dir=")]
    return Path(given[-1] if given else "multirun")


OUTPUT_SETTINGS = {
    "config": "hydra.run.dir", "config_paper": "hydra.run.dir", "baseline": "hydra.run.dir",
    "evaluate": "output", "collect": "out_dir", "train_dynamics": "output_dir",
    "select_psi": "json", "report": "out",
}  # fmt: skip
"""The setting that chooses where each program writes (suggested when a write is refused)."""


def hydra_entry(
    config_name: str,
    uses_cache: bool = False,
    check_values: bool = True,
    validate: Callable[[DictConfig], None] | None = None,
) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """``hydra.main`` over :data:`CONFIG_DIR`, with one paragraph and exit code 2 for bad input.

    An error Hydra raises before the task function starts (a value of the wrong
    type, an unknown key or config group option, a run directory it cannot
    create) is bad input: it is printed by :func:`describe_hydra_error` and the
    command exits with 2. Failures inside the task function keep Hydra's report
    and their own exit codes. ``uses_cache``: the script writes under
    ``$CBOP_TORCHRL_CACHE``, which is then checked to be writable first thing.
    ``check_values``: refuse NaN numbers and empty strings (which the schema lets
    through) before the task; False where ``load_config`` reports them among every
    other problem. ``validate``: the program's own checks of its whole config (its data
    and output paths included), which refuse (exit 2) what cannot run; called after the
    shared checks and before the task function, so no stage starts on a bad value.
    """
    register_schemas()

    def decorate(task_function: Callable[[DictConfig], Any]) -> Callable[[], Any]:
        entry = _Entry(config_name, task_function, uses_cache, check_values, validate)
        return functools.update_wrapper(functools.partial(entry.main), task_function)

    return decorate


class _Entry:
    """One program's entry point: its task function under ``hydra.main``.

    Hydra prints a composition error over several lines (with OmegaConf's
    reference_type/object_type) and exits with 1. ``HYDRA_FULL_ERROR``, Hydra's public
    switch, makes it raise the error instead, so that :meth:`main` can rephrase it: the
    switch is on while Hydra composes a config and off while the task runs (a task's
    failure keeps Hydra's report). A ``HYDRA_FULL_ERROR`` the user set is left alone, and
    Hydra's errors are then not rephrased.
    """

    def __init__(
        self,
        config_name: str,
        task_function: Callable[[DictConfig], Any],
        uses_cache: bool,
        check_values: bool,
        validate: Callable[[DictConfig], None] | None = None,
    ) -> None:
        self.config_name = config_name
        self.validate = validate
        self.task_function = task_function
        self.uses_cache = uses_cache
        self.check_values = check_values
        self.user_full_error = "HYDRA_FULL_ERROR" in os.environ
        self.started = False  # Hydra got as far as the task function
        self.raised_by_task: list[BaseException] = []
        # Hydra names the job after the task function it is given (``__wrapped__``)
        self.task = functools.update_wrapper(functools.partial(self.run_task), task_function)
        self.hydra_main = hydra.main(
            config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3"
        )(self.task)

    def hydra_raises(self, raises: bool) -> None:
        """Switches ``HYDRA_FULL_ERROR`` on (Hydra raises its errors) or off (it reports
        them), unless the user set it."""
        if self.user_full_error:
            return
        if raises:
            os.environ["HYDRA_FULL_ERROR"] = "1"
        else:
            os.environ.pop("HYDRA_FULL_ERROR", None)

    def main(self) -> Any:
        """The program: Hydra's main, with bad input refused in one paragraph (exit 2) and
        Ctrl-C ending with how to go on (exit 130)."""
        self.hydra_raises(True)
        sweep_dir = _new_sweep_dir(sys.argv[1:])
        try:
            help_args = help_arguments(sys.argv[1:])
            if help_args is not None and print_help(self.config_name, self.task, help_args):
                sys.exit(0)  # as Hydra after its help
            return self.hydra_main()
        except KeyboardInterrupt:
            interrupted(self.config_name)
        except SystemExit as exit_:
            if exit_.code == 1 and not self.started:
                sys.exit(EXIT_BAD_INPUT)
            if exit_.code == EXIT_BAD_INPUT:
                _remove_refused_sweep_dir(sweep_dir)
            raise
        except Exception as error:
            # Raised here: Hydra's own failure before a job (a task's failure is reported
            # by Hydra, HYDRA_FULL_ERROR being off while and after it runs).
            from_task = any(error is raised for raised in self.raised_by_task)
            message = None
            if not (from_task or self.user_full_error):
                message = describe_hydra_error(error, self.config_name)
            if message is None:
                raise
            _remove_refused_sweep_dir(sweep_dir)
            refuse(message)
        finally:
            self.hydra_raises(False)

    def run_task(self, cfg: DictConfig) -> Any:
        """The task function on the composed config, after the checks no work may precede."""
        self.started = True
        self.hydra_raises(False)  # from here on Hydra reports failures its own way
        run_dir = HydraConfig.get().runtime.output_dir
        remember_hydra_job(copy.deepcopy(cfg), HydraConfig.instance().cfg)
        set_output_setting(OUTPUT_SETTINGS.get(base_config_name(self.config_name)))
        keep_mujoco_log_out_of_cwd()
        self.check(cfg, run_dir)
        lines = resolve_progress(cfg)
        try:
            result = self.task_function(cfg)
        except Exception as error:
            refuse_known_failure(error, run_dir)
            self.raised_by_task.append(error)
            raise
        finally:
            if lines is not None:
                lines.close_bars()
                sys.stderr = lines.stream
        if not self.raised_by_task:
            # A multirun composes its next job's config after this job ends: raised
            # (not reported by Hydra), a bad value there is refused like the first job's.
            self.hydra_raises(True)
        return result

    def check(self, cfg: DictConfig, run_dir: str) -> None:
        """Refuses (exit 2) a composed config that cannot run, before any work: a ``${...}``
        that cannot be resolved, a key added with ``+``, a missing value, a value no setting
        takes or out of its range, an unwritable cache. Caps the threads at the cores."""
        config_name = self.config_name
        try:  # a ${...} that cannot be resolved fails here, not in the middle of the work
            OmegaConf.to_container(cfg, resolve=True)
        except InterpolationResolutionError as error:
            refuse(describe_interpolation_error(error), run_dir)
        for key in ("threads", "num_threads"):
            if key in cfg:
                cfg[key], note = capped_threads(cfg[key])
                if note is not None:
                    print(f"note: {note}", file=sys.stderr)
        if extra := unknown_keys(cfg, CONFIG_SCHEMAS[base_config_name(config_name)]):
            refuse(
                f"{', '.join(extra)}: not a setting of this script (added with +); see "
                f"{config_file(config_name)} for every setting",
                run_dir,
            )
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            refuse(
                f"{', '.join(missing)} must be given on the command line "
                f"({' '.join(f'{key}=...' for key in missing)}); see "
                f"{config_file(config_name)} for what each key holds",
                run_dir,
            )
        if self.check_values and (problems := not_a_number_or_empty(config_values(cfg))):
            refuse("; ".join(problems), run_dir)
        # every numeric setting against its range (config.SETTING_RANGES), before any work
        # (cbop-train and cbop-baseline: load_config, with every other problem at once)
        if self.check_values and (problems := range_problems(config_values(cfg))):
            refuse("; ".join(problems), run_dir)
        if self.uses_cache:
            check_cache_writable(run_dir)
        if self.validate is not None:  # the program's own checks: paths, outputs, requests
            self.validate(cfg)


def refuse_known_failure(error: Exception, run_dir: str) -> None:
    """Refuses (exit 2) a task's failure that is the machine's or the input's, wherever it
    happened: a full disk, a file no program of ours wrote, a refused write, memory past the
    estimate (memory.py), each in one paragraph without a traceback. A failure on the way out
    of Ctrl-C is the interrupt. Returns for any other error."""
    if raised_while_interrupted(error):
        raise KeyboardInterrupt from None
    if isinstance(error, ForeignFileError):
        refuse(error, run_dir)
    # every write the system stopped (no space, quota, file-size limit, read-only, no
    # permission), whoever raised it, in one paragraph (io.write_failure)
    if (failure := write_failure(error, run_dir, cleaned=False)) is not None:
        refuse(failure, run_dir)
    if is_out_of_memory(error):
        refuse(out_of_memory_message(error), run_dir)


def _new_sweep_dir(argv: Sequence[str]) -> Path | None:
    """The sweep directory a ``-m`` command line makes when it does not exist yet, else None."""
    sweep_dir = _sweep_dir(argv)
    return sweep_dir if sweep_dir is not None and not sweep_dir.exists() else None


def _remove_refused_sweep_dir(sweep_dir: Path | None) -> None:
    """Removes a new sweep directory that holds only ``multirun.yaml``: what a multirun whose
    first job's values were refused wrote."""
    if (
        sweep_dir is not None
        and sweep_dir.is_dir()
        and {p.name for p in sweep_dir.iterdir()} <= {"multirun.yaml"}
    ):
        shutil.rmtree(sweep_dir)


def resolve_progress(cfg: DictConfig) -> ProgressLines | None:
    """Turns ``progress: null`` (the default) into bars that suit where stderr goes.

    On a terminal: live bars (``progress=true``). Otherwise (a file, a pipe, ``nohup``, a
    cluster job): bars too, but ``sys.stderr`` becomes a :class:`ProgressLines` that keeps a
    few whole lines per bar; it is returned so the caller restores ``sys.stderr`` after the
    task. An explicit ``progress=true|false`` is left as it is (None returned).
    """
    if "progress" not in cfg or cfg.progress is not None:
        return None
    cfg.progress = True
    if sys.stderr.isatty():
        return None
    lines = ProgressLines(sys.stderr)
    sys.stderr = lines
    return lines


def raised_while_interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while a KeyboardInterrupt was being handled.

    Some context managers fail on their way out of an interrupt (tensordict's
    parameter swap raises "Converting a tensordict to boolean value is not permitted"),
    which would hide the Ctrl-C behind their own error.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def interrupted(config_name: str) -> NoReturn:
    """Ctrl-C (SIGINT): one line saying how to go on, and exit code 130 (128 + SIGINT)."""
    program = running_program()
    start = [program_command(program)] if program else [sys.executable, sys.argv[0]]
    command = shlex.join([*start, *sys.argv[1:]])
    if config_name in RESUMABLE_CONFIGS:
        how = f"resume with the same command (it continues from the last checkpoint): {command}"
    else:
        how = f"run the same command to start again: {command}"
    print(f"\ninterrupted; {how}", file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)


def run_entry(main: Callable[[], Any], argv: Sequence[str] | None = None) -> int:
    """Runs a :func:`hydra_entry` program in this process and returns its exit code.

    ``argv``: the command-line arguments (Hydra overrides and flags such as
    ``-m`` or ``--cfg job``); None reads them from ``sys.argv`` like a console
    script. For callers that want a code rather than ``SystemExit`` (tests).
    """
    saved = sys.argv
    if argv is not None:
        sys.argv = [saved[0] if saved else "cbop", *argv]
    try:
        returned = main()
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    # a program whose main returns its exit code (cbop-report) rather than exiting
    return returned if isinstance(returned, int) and not isinstance(returned, bool) else 0
