"""``cbop-report`` (``scripts/report.py``): the analysis report: results table, learning
curves and the paper's figures.

    cbop-report paths=benchmarks/results                     # the committed summaries
    cbop-report paths=runs/hopper-medium-replay-gen/cpu out=report/
    cbop-report paths=[multirun/,runs/x/cpu/default] analysis=false

``paths`` are run directories (holding results.json), sweep directories or
folders of benchmark summaries, in any mix. Writes into ``out``: results.md/.csv
(normalized score mean +- std over seeds, final and best), runs.csv, headline.md,
curves_<dataset>.png (of a results folder: the 50,000-step protocol's rows; its
20,000-step rows in curves_20k_<dataset>.png), horizon_<dataset>.png (E[h], paper Fig. 1 right),
rh_<dataset>_<variant>.png (R_h at one state, Fig. 5), share_<...>.png
(A/(A+B), Fig. 8), conservatism.md/.csv (Table 2), rliable.md/.json/.png
(IQM, optimality gap, probability of improvement; needs rliable) and
README_results.md (the README's results section). The checkpoint-based figures
come from a run directory's checkpoint, or from a summary that stored them.
Every setting: ``cbop_torchrl/configs/report.yaml``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, ListConfig

from cbop_torchrl.cli import (
    check_output_writable,
    hydra_entry,
    refuse,
    run_entry,
)
from cbop_torchrl.config import ConfigError
from cbop_torchrl.data import DatasetError
from cbop_torchrl.envs import filter_env_warnings
from cbop_torchrl.evaluation.headline import current_files_in, headlines_in, long_headlines_in
from cbop_torchrl.evaluation.report import write_report
from cbop_torchrl.evaluation.summaries import ReportError, check_report_paths, load_summaries
from cbop_torchrl.io import (
    ForeignFileError,
    check_owned_output,
    deferred_replace,
    owned_outputs,
    remove_stale_outputs,
)
from cbop_torchrl.trainers.checkpoint import CheckpointError


def report_paths(value: object) -> list[str]:
    """``paths=`` (one path or a list of paths) as a list; refuses (exit 2) anything else."""
    items = list(value) if isinstance(value, (ListConfig, list, tuple)) else [value]
    if not items or any(item is None or isinstance(item, (DictConfig, dict)) for item in items):
        refuse(
            f"paths={value} must be a path or a list of paths, e.g. paths=benchmarks/results "
            "or paths=[runs/a,multirun/b]"
        )
    return [str(item) for item in items]


REQUIRED_MODULES = ("matplotlib",)
"""What the report cannot do without (its figures); ``rliable`` is optional (IQM tables)."""


def check_report_dependencies() -> None:
    """Refuses (exit 2) before any work when a module of the ``[report]`` extra is missing,
    so no partial report (tables without figures) is left behind."""
    for name in REQUIRED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as error:
            refuse(
                f"cbop-report draws its figures with {name}, which cannot be imported "
                f'({error}); install the report extra: pip install "cbop-torchrl[report]" '
                "(matplotlib, rliable, pandas), then run the same command again"
            )


PROGRAM = "cbop-report"
REPORT_FILES = (
    "results.md", "results.csv", "runs.csv", "README_results.md", "conservatism.md",
    "conservatism.csv", "rliable.md", "rliable.json", "rliable.png",
)  # fmt: skip
"""The report's files whose names do not depend on the data (checked before any work; the
figures named after datasets are checked as they are written)."""


def validate(cfg: DictConfig) -> None:
    """Refuses (exit 2), before any work: a missing dependency, ``paths=`` that is no list
    of existing folders or files, an ``out=`` that cannot be written or holds a file no
    report wrote."""
    check_report_dependencies()
    if not isinstance(cfg.rliable_reps, int) or cfg.rliable_reps < 1:
        refuse(
            f"rliable_reps={cfg.rliable_reps}: the number of bootstrap resamples behind "
            "rliable's intervals must be a whole number of at least 1; the default, "
            "rliable_reps=2000, is what the committed report uses"
        )
    paths = report_paths(cfg.paths)
    check_output_writable("out", cfg.out)
    try:  # before any work: the report replaces only files a report wrote
        for name in REPORT_FILES:
            check_owned_output(Path(cfg.out) / name, PROGRAM)
    except ForeignFileError as error:
        refuse(f"out={cfg.out}: {error}")
    try:  # every data path, before any summary is read
        check_report_paths(paths)
    except ReportError as error:
        refuse(error)


def run(cfg: DictConfig) -> None:
    """The Hydra task: load the runs and summaries, write the report, print its table."""
    paths = report_paths(cfg.paths)
    try:
        # a benchmark results folder names each set's current file and headline rows
        summaries = load_summaries(paths, analysis=cfg.analysis, current=current_files_in(paths))
        prefix = cfg.figure_prefix
        if prefix is None:
            prefix = os.path.relpath(cfg.out).rstrip("/") + "/"
        # every file it writes (figures too) checked, and all renamed into place together
        # once all are written: a failure half way (a full disk) changes no file
        with owned_outputs(cfg.out, PROGRAM), deferred_replace():
            # a results folder: the 50,000-step rows first, the 20,000-step rows below
            report = write_report(
                summaries,
                cfg.out,
                figure_prefix=prefix,
                headline=headlines_in(paths),
                long_headline=long_headlines_in(paths),
                rliable_reps=cfg.rliable_reps,
            )
        remove_stale_outputs(cfg.out, PROGRAM, report["files"])
    except (ReportError, ConfigError, DatasetError, CheckpointError) as error:
        refuse(error)
    print(Path(cfg.out, "results.md").read_text(), end="")
    print(f"[report] {len(summaries)} runs; {len(report['files'])} files in {cfg.out}/")
    if report["rliable"] is None:
        print("[report] rliable is not installed: no IQM/optimality gap (pip install rliable)")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the program on ``argv`` (Hydra overrides and flags; default: the command line)
    and returns its exit code."""
    filter_env_warnings()
    words = sys.argv[1:] if argv is None else list(argv)

    def program() -> None:
        hydra_entry("report", validate=validate)(run)()

    return run_entry(program, words)
