"""The learning benchmark: CBOP, its ablations and the baselines on the generated datasets.

    python benchmarks/learning.py                                 # hopper-medium-replay-gen
    python benchmarks/learning.py --datasets hopper-medium-replay-gen walker2d-medium-replay-gen
    python benchmarks/learning.py --algos cbop bc --seeds 0       # a subset
    python benchmarks/learning.py --algos cbop-map cbop-quantile  # ablations
    python benchmarks/learning.py --dry-run                       # list what would run
    python benchmarks/learning.py --algos cbop cql --epochs 60 --label 60k  # longer, kept apart
    nohup python benchmarks/learning.py > bench.log 2>&1 &        # over several sittings

Every algorithm runs with the same preset (default ``cpu``), batch, network
sizes and evaluation (every 1,000 steps, 10 episodes). CBOP trains
``--epochs x --steps-per-epoch`` gradient steps (default 20,000) after its
dynamics ensemble, its BC actor and its FQE critic (the preset's ``bc.steps``
and ``fqe.steps``); each baseline trains as many gradient steps as CBOP's
whole pipeline, BC + FQE + CBOP, so no algorithm gets fewer updates. A run's
summary's final score is the mean of its last 3 evaluations (``rows.json`` takes a ``-50k``
row's over its last 4, the 50,000-step protocol's); its summary states that measure
(``final_measure``) and adds the mean of the last 10 with a bootstrap interval and the
evaluation-to-evaluation noise. Every evaluation also scores one episode from each of
``--start-states`` (100) fixed dataset states restored in the simulator (the summary's
``start_states``), beside the standard reset evaluation, which stays the primary score.
After each run ``<results>/<dataset>/rows.json`` gives every row's score, its interval
over seeds and evaluations, and how far two rows must be apart to differ (``--rows``
rewrites it alone). Runs go seed by seed,
algorithms in the given order (CBOP first, then BC, then the others); ``--grouping`` says
whether several of them train one at a time, in processes at once or side by side (default
``auto``: what ``scripts/bench.py --side-by-side`` measured faster on this machine;
:mod:`benchmarks.learning_grouping`).

Resumable: a run whose summary exists in ``--results`` is skipped; an
unfinished run continues from its checkpoint (the run directories live
outside the repository, under ``--runs``). After each finished run its summary
(final/best normalized score, learning curve, E[h] and target diagnostics,
the checkpoint-based analysis for CBOP, the exact command, the commit) is
written to ``<results>/<dataset>/<variant>/seed<k>.json``; commit those, and
rebuild the tables and figures with ``python scripts/report.py paths=benchmarks/results``.
A summary no longer counts, and its run starts over, when it was made on another version
of the dataset, for another budget, or (CBOP) with other settings than the variant's
composed config (critic and actor widths, M, K, H, batch, psi, the dynamics model's epoch
cap): after a preset change the old rows read "stale" and the run directories made with
them are moved aside. A summary
made on another version of the dataset is kept as ``<variant>-file-<sha12>/seed<k>.json``
(the report names its row ``VARIANT (file SHA)``). Keep such
rows under a label that asks for their settings (the 2x256 preset as
``--label c2x256 "agent.critic_hidden_sizes=[256,256]"``).

A preset other than ``cpu`` keeps its runs and summaries apart as
``<variant>-<preset>`` (``--preset paper``, e.g. on a GPU: ``cbop-paper``), so they never
count as, or replace, the CPU preset's. ``--label L`` keeps runs of another budget or
other overrides apart: their run directories and summaries are named ``<variant>-L``
(``cbop-60k``; with both, ``cbop-paper-60k``). A labelled run
whose directory does not exist yet starts as a copy of the unlabelled run when
that one is shorter, and continues it; the shorter run and its summary stay as
they are.

In slices (a job with a time limit, a lent GPU): ``--max-minutes M`` trains until
the wall-clock budget is nearly spent, stops right after a checkpoint, prints
"resume with the same command" and exits 0; the same command continues exactly
where it stopped (:mod:`cbop_torchrl.trainers.slicing`). ``--slice-steps N`` stops
after N gradient steps instead (deterministic). Each run keeps its slices in
``<run dir>/slices.json`` and a finished run's summary lists them (``slices``)::

    python benchmarks/learning.py --preset paper --algos cbop --seeds 0 --max-minutes 8

Runs read ``$CBOP_TORCHRL_CACHE/generated/<name>.hdf5``: the repository's copy of the set
(``benchmarks/data``, or the package's demo file for hopper), else a file the generator makes
there (``benchmarks/make_datasets.sh``) when missing (benchmarks/set_files.py).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning (as in scripts/cbop.py): on a busy machine
# spinning threads slow every small matmul down by up to 10x. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import datetime
import json
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/learning.py` puts benchmarks/, not the root

from benchmarks import BenchmarkInputError, run_main  # noqa: E402
from benchmarks.learning_grouping import (  # noqa: E402
    GROUPINGS,
    PendingRun,
    choose_grouping,
    default_workers,
    device_kind,
    read_records,
    run_in_processes,
    this_machine,
)
from benchmarks.learning_jobs import claim_job_dir, side_by_side_command  # noqa: E402
from benchmarks.set_files import dataset_provenance, ensure_dataset  # noqa: E402
from cbop_torchrl.evaluation.summaries import (  # noqa: E402
    CURRENT,
    read_scalar_curves,
    summarize_run,
)
from cbop_torchrl.io import (  # noqa: E402
    atomic_json_dump,
    cache_dir,
    find_regular_files,
    read_regular_text,
)
from cbop_torchrl.trainers.rundir import MARKER_NAME  # noqa: E402
from cbop_torchrl.trainers.slicing import (  # noqa: E402
    DEADLINE_ENV,
    SLICE_END_NAME,
    SLICE_EXIT_CODE,
    STEPS_ENV,
)

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "cbop": ("cbop.py", []),
    "cbop-map": ("cbop.py", ["estimator.mode=map"]),
    "cbop-fixed-uniform": (
        "cbop.py",
        ["estimator.mode=fixed", "estimator.fixed_weighting=uniform"],
    ),
    "cbop-fixed-lambda": ("cbop.py", ["estimator.mode=fixed", "estimator.fixed_weighting=lambda"]),
    "cbop-quantile": ("cbop.py", ["estimator.mode=quantile"]),
    # The paper's Algorithm 2 with the authors' 5 rounds (docs/learning.md, Experiment 4).
    "cbop-fqe-rounds5": ("cbop.py", ["fqe.rounds=5"]),
    # The paper's psi grid {0.5, 2, 3, 5} (appendix, "Hyperparameters"). A set's plain
    # "cbop" row is the grid's row at that set's default psi (the paper's D4RL table).
    "cbop-psi0.5": ("cbop.py", ["estimator.psi=0.5"]),
    "cbop-psi2": ("cbop.py", ["estimator.psi=2"]),
    "cbop-psi3": ("cbop.py", ["estimator.psi=3"]),
    "cbop-psi5": ("cbop.py", ["estimator.psi=5"]),
    # The paper's critic depth and batch at the CPU preset's other sizes (Experiments 32-33).
    "cbop-c3x256b256": (
        "cbop.py",
        ["agent.critic_hidden_sizes=[256,256,256]", "train.batch_size=256"],
    ),
    # BEYOND THE PAPER (opt-in): a behaviour-cloning term in the actor's loss
    # (docs/learning.md, Experiment 15), ablated against plain "cbop".
    "cbop-bc10": ("cbop.py", ["agent.bc_weight=10"]),
    "bc": ("baseline.py", ["algo=bc"]),
    "td3bc": ("baseline.py", ["algo=td3bc"]),
    "iql": ("baseline.py", ["algo=iql"]),
    "cql": ("baseline.py", ["algo=cql"]),
}
"""Benchmark variant -> (entry script, its overrides)."""
DEFAULT_ALGOS = list(CURRENT)
START_STATES = 100
"""Dataset states of every run's start-state evaluation (``eval.start_states``; the same
fixed rows for every run on a dataset, cbop_torchrl/envs/starts.py)."""
ROWS_NAME = "rows.json"
ROWS_FORMAT = "cbop-torchrl-rows/1"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["hopper-medium-replay-gen"])
    parser.add_argument("--algos", nargs="+", default=DEFAULT_ALGOS, choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--preset", default="cpu", help="cpu | debug | paper (presets)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--runs", type=Path, default=None, help="default: <cache>/benchmark_runs")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run")
    parser.add_argument(
        "--eval-interval", type=int, default=1000, help="gradient steps between evaluations"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=20,
        help="CBOP's train.epochs (x --steps-per-epoch = its gradient steps, pinned here so a "
        "later preset change cannot make the runs unequal); baselines add BC's and FQE's steps",
    )
    parser.add_argument("--steps-per-epoch", type=int, default=1000)
    parser.add_argument(
        "--label",
        default=None,
        help="name runs and summaries <variant>-LABEL (e.g. 60k); a new labelled run continues "
        "a copy of the unlabelled one when that is shorter",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="wall-clock budget of this invocation: stop after a checkpoint before it is spent, "
        "exit 0, and continue with the same command (a run still in its dynamics/BC/FQE stage "
        f"at the budget is stopped {KILL_GRACE_S:.0f} s after it and resumes from that "
        "stage's last checkpoint)",
    )
    parser.add_argument(
        "--slice-steps",
        type=int,
        default=None,
        help="stop each invocation at the first checkpoint at least this many gradient steps "
        "after where it started (deterministic slices; with --max-minutes, whichever is first)",
    )
    parser.add_argument(
        "--start-states",
        type=int,
        default=START_STATES,
        help="also evaluate every run on one episode from each of this many fixed dataset states "
        "restored in the simulator (eval.start_states; the reset score stays the primary one); "
        "0: off",
    )
    parser.add_argument(
        "--rows",
        action="store_true",
        help="only (re)write <results>/<dataset>/rows.json (each row's score and interval over "
        "seeds and evaluations) from the summaries there, and exit",
    )
    parser.add_argument(
        "--grouping",
        choices=GROUPINGS,
        default="auto",
        help="how several runs train: one at a time, up to --workers processes at once, or "
        "each CBOP variant's seeds side by side in one cbop-train job (runs.seeds=[...]); "
        "auto: whichever scripts/bench.py --side-by-side measured faster on this machine "
        "(benchmarks/learning_grouping.py); with --max-minutes/--slice-steps, one at a time",
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="the same as --grouping side-by-side",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="with --grouping processes: runs at once (default: the cores / --threads)",
    )
    parser.add_argument("--no-analysis", action="store_true", help="skip checkpoint analysis")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument(
        "overrides", nargs="*", help="extra Hydra overrides for every run (e.g. eval.episodes=5)"
    )
    args = parser.parse_args(argv)
    if args.max_minutes is not None and not args.max_minutes > 0:
        parser.error(f"--max-minutes {args.max_minutes}: give a positive number (e.g. 8)")
    if args.start_states < 0:
        parser.error(f"--start-states {args.start_states}: give 0 (off) or a positive number")
    if args.side_by_side:
        args.grouping = "side-by-side"
    sliced = args.max_minutes is not None or args.slice_steps is not None
    if args.grouping in ("side-by-side", "processes") and sliced:
        parser.error(
            f"--grouping {args.grouping} trains whole runs; drop --max-minutes/--slice-steps, "
            "or use --grouping one to train in slices"
        )
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers {args.workers}: give a positive number (e.g. 2)")
    if args.slice_steps is not None and args.slice_steps < 1:
        parser.error(f"--slice-steps {args.slice_steps}: give a positive number (e.g. 10000)")
    return args


#: Seconds past the --max-minutes budget after which a run that has not stopped by itself
#: (it is in a stage before CBOP's, which has checkpoints but no budget check) is stopped.
KILL_GRACE_S = 60.0


def _interruptible() -> None:
    """Runs in the child before it starts: SIGINT back to its default action.

    A process started with SIGINT ignored (a job a script put in the background with ``&``,
    some CI runners, pytest-xdist's workers) passes that on, and Python then never turns
    SIGINT into KeyboardInterrupt: the deadline's SIGINT would do nothing until the SIGKILL
    30 s later, which skips the program's own message on how to resume.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class SliceOutcome(NamedTuple):
    """How one invocation of a run's command ended under a slice budget.

    (A NamedTuple, not a dataclass: tests load this file without registering it as a module,
    which a dataclass's string annotations need.)
    """

    finished: bool  # the run reached its last step (exit 0)
    step: int | None  # the CBOP step it stopped at (None: stopped before the CBOP stage)
    returncode: int
    # Interrupted at the deadline: the last CBOP step it logged (None: not in the CBOP stage).
    logged_step: int | None = None


def last_logged_cbop_step(run_dir: Path) -> int | None:
    """The last CBOP gradient step ``run_dir`` logged (its ``train/`` curves, ``eval/`` too).

    None while the run has not reached its CBOP stage (the stages before it log no such
    curve). A run interrupted between two checkpoints resumes from the last one, before
    this step.
    """
    last = [
        points[-1][0]
        for prefix in ("train/", "eval/")
        for points in read_scalar_curves(run_dir, prefix).values()
        if points
    ]
    return int(max(last)) if last else None


def slice_end_label(outcome: SliceOutcome, steps: int) -> str:
    """Where a slice left its run: ``at gradient step S of N`` or the stage it was in."""
    if outcome.step is not None:
        return f"at gradient step {outcome.step} of {steps}"
    if outcome.logged_step is not None:
        return (
            f"in its CBOP stage after gradient step {outcome.logged_step} of {steps} (the last "
            "logged; it resumes from its last checkpoint)"
        )
    return "before its CBOP stage"


def child_environment(deadline: float | None, slice_steps: int | None) -> dict[str, str]:
    """The environment of a run's process: this one's, the slice budget, this checkout first.

    ``PYTHONPATH`` starts with this checkout, so the run imports the package beside the scripts
    it runs, whatever the interpreter's own install points at (an editable install made from
    another worktree would otherwise train that worktree's code under this one's commit).
    """
    env = dict(os.environ)
    env.pop(DEADLINE_ENV, None)
    env.pop(STEPS_ENV, None)
    if deadline is not None:
        env[DEADLINE_ENV] = repr(deadline)
    if slice_steps is not None:
        env[STEPS_ENV] = str(slice_steps)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_slice(
    command: list[str], run_dir: Path, args: argparse.Namespace, deadline: float | None
) -> SliceOutcome:
    """Runs ``command`` under the invocation's budget and records the slice in ``slices.json``.

    Returns a :class:`SliceOutcome`. The child gets the budget through the
    environment (:mod:`cbop_torchrl.trainers.slicing`); one still running
    :data:`KILL_GRACE_S` after the deadline is interrupted (SIGINT, then SIGKILL).
    """
    env = child_environment(deadline, args.slice_steps)
    (run_dir / SLICE_END_NAME).unlink(missing_ok=True)
    started_utc = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    start = time.time()
    process = subprocess.Popen(command, cwd=ROOT, env=env, preexec_fn=_interruptible)
    try:
        timeout = None if deadline is None else max(deadline + KILL_GRACE_S - time.time(), 1.0)
        returncode = process.wait(timeout=timeout)
        killed = False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            returncode = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        killed = True
    end_path = run_dir / SLICE_END_NAME
    step = None
    if returncode == SLICE_EXIT_CODE and end_path.is_file():
        step = int(json.loads(end_path.read_text())["step"])
        end_path.unlink()
    finished = returncode == 0 and not killed
    logged_step = None
    if finished:
        step = run_steps(run_dir)
        outcome = "finished"
    elif killed:
        outcome = "interrupted at the deadline (resumes from the last checkpoint of its stage)"
        # Between two checkpoints (e.g. 9,000 steps into a stage that saves every 10,000):
        # the stage it was in comes from what it logged.
        logged_step = last_logged_cbop_step(run_dir)
    elif step is not None:
        outcome = "budget spent after a checkpoint"
    else:
        outcome = f"failed (exit {returncode})"
    history_path = run_dir / "slices.json"
    history = json.loads(history_path.read_text()) if history_path.is_file() else []
    if run_dir.is_dir():
        history.append(
            {
                "slice": len(history) + 1,
                "started_utc": started_utc,
                "wall_s": round(time.time() - start, 1),
                "end_step": step,
                "stage": "cbop" if step is not None or logged_step is not None else "before cbop",
                "last_logged_step": logged_step,
                "outcome": outcome,
                "max_minutes": args.max_minutes,
                "slice_steps": args.slice_steps,
                "host": platform.node(),
            }
        )
        atomic_json_dump(history, history_path)
    if killed:
        returncode = SLICE_EXIT_CODE
    return SliceOutcome(finished, step, returncode, logged_step)


def resume_message(argv: list[str] | None, why: str) -> str:
    command = shlex.join(
        ["python", "benchmarks/learning.py", *(sys.argv[1:] if argv is None else argv)]
    )
    return f"[bench] {why}; resume with the same command:\n    {command}"


def pretraining_steps(preset: str, overrides: list[str]) -> int:
    """CBOP's BC + FQE gradient steps: the preset's, or ``bc.steps=``/``fqe.steps=`` overrides."""
    from omegaconf import OmegaConf

    values = OmegaConf.load(ROOT / "cbop_torchrl" / "configs" / "preset" / f"{preset}.yaml")
    steps = {"bc": int(values.bc.steps), "fqe": int(values.fqe.steps)}
    for override in overrides:
        key, _, value = override.partition("=")
        if key in ("bc.steps", "fqe.steps"):
            steps[key.split(".")[0]] = int(value)
    return steps["bc"] + steps["fqe"]


def variant_steps(variant: str, args: argparse.Namespace) -> int:
    """Gradient steps of ``variant``: CBOP's own; a baseline's = BC + FQE + CBOP (the pipeline)."""
    cbop_steps = args.epochs * args.steps_per_epoch
    if VARIANTS[variant][0] == "cbop.py":
        return cbop_steps
    return cbop_steps + pretraining_steps(args.preset, list(args.overrides))


def variant_name(variant: str, preset: str, label: str | None) -> str:
    """The name of a variant's run directories and summaries: ``<variant>[-<preset>][-<label>]``."""
    return "-".join([variant, *([preset] if preset != "cpu" else []), *([label] if label else [])])


def other_dataset(summary: dict, provenance: dict) -> bool:
    """Whether a stored summary was made on another version of the dataset."""
    stored = summary.get("dataset_provenance", {})
    return bool(provenance) and stored.get("sha256") != provenance.get("sha256")


# The dynamics cap each preset had before summaries recorded it (they recorded no
# ``dynamics_max_epochs`` until Nov 28 2026); "patience": no cap, the paper's rule alone.
DYNAMICS_CAP_BEFORE_RECORDED = {"cpu": 15, "debug": 1, "paper": "patience"}


def dynamics_cap(max_epochs: int | None) -> int | str:
    """``dynamics.max_epochs`` as the settings compare it: ``"patience"`` where it is None."""
    return "patience" if max_epochs is None else int(max_epochs)


def cbop_settings(config: dict) -> dict:
    """What makes a CBOP run the algorithm it is, from its composed or stored config.

    The keys are those a run's summary records under ``diagnostics.settings``; a value is
    None where the config leaves it to the dataset (the paper's, e.g. psi).
    """
    agent = config["agent"]
    actor = list(agent["hidden_sizes"])
    return {
        "critic_hidden_sizes": list(agent.get("critic_hidden_sizes") or actor),
        "actor_hidden_sizes": actor,
        "num_qvalue_nets": agent["num_qvalue_nets"],
        "num_elites": config["dynamics"]["num_elites"],
        "dynamics_max_epochs": dynamics_cap(config["dynamics"].get("max_epochs")),
        "horizon": config["estimator"]["horizon"],
        "batch_size": config["train"]["batch_size"],
        "psi": config["estimator"]["psi"],
    }


def expected_settings(variant: str, preset: str, overrides: list[str]) -> dict | None:
    """:func:`cbop_settings` of the config ``variant`` runs with (None: a baseline)."""
    script, variant_overrides = VARIANTS[variant]
    if script != "cbop.py":
        return None
    from omegaconf import OmegaConf

    from cbop_torchrl.apps.api import compose_config

    composed = compose_config([f"preset={preset}", *variant_overrides, *overrides])
    return cbop_settings(OmegaConf.to_container(composed, resolve=True))


def recorded_settings(summary: dict, preset: str) -> dict:
    """A CBOP summary's ``diagnostics.settings``, with the dynamics cap it was made with.

    A summary from before the cap was recorded took it from its command's
    ``dynamics.max_epochs=`` override, or else from its preset as it was then.
    """
    settings = dict((summary.get("diagnostics") or {}).get("settings") or {})
    if "dynamics_max_epochs" in settings:
        settings["dynamics_max_epochs"] = dynamics_cap(settings["dynamics_max_epochs"])
        return settings
    # The command was written by shlex.join (portable_command); Hydra takes the last override.
    given = [
        word.split("=", 1)[1]
        for word in shlex.split(str(summary.get("command", "")))
        if word.startswith("dynamics.max_epochs=")
    ]
    made_with = summary.get("preset", preset)
    if given and given[-1] == "null":
        settings["dynamics_max_epochs"] = dynamics_cap(None)
    elif given and given[-1].isdigit():
        settings["dynamics_max_epochs"] = dynamics_cap(int(given[-1]))
    elif made_with in DYNAMICS_CAP_BEFORE_RECORDED:
        settings["dynamics_max_epochs"] = DYNAMICS_CAP_BEFORE_RECORDED[made_with]
    return settings


def settings_differences(recorded: dict, expected: dict) -> list[str]:
    """The settings in ``recorded`` that differ from ``expected`` (``"key: old -> new"``).

    A summary written before the widths were recorded made critics as wide as its actor
    (``agent.critic_hidden_sizes`` did not exist), so a missing width reads that way; a
    value left to the dataset (None) is not compared.
    """
    actor = recorded.get("actor_hidden_sizes", expected["actor_hidden_sizes"])
    recorded = {"actor_hidden_sizes": actor, "critic_hidden_sizes": actor, **recorded}
    differences = []
    for key, wanted in expected.items():
        if wanted is None or key not in recorded:
            continue
        have = recorded[key]
        if (list(have) if isinstance(have, (list, tuple)) else have) != wanted:  # 5 == 5.0
            differences.append(f"{key}: {have} -> {wanted}")
    return differences


def run_settings_differences(run_dir: Path, expected: dict | None) -> list[str]:
    """How the run in ``run_dir`` (its ``config.json``) differs from ``expected`` ([]: same)."""
    path = run_dir / "config.json"
    if expected is None or not path.is_file():
        return []
    stored = json.loads(path.read_text())
    try:
        return settings_differences(cbop_settings(stored), expected)
    except (KeyError, TypeError):  # an older or partial config.json: nothing to compare
        return []


def run_on_current_file(run_dir: Path, provenance: dict) -> bool:
    """Whether the run in ``run_dir`` was made on the dataset's current version.

    Its ``data.json`` records the file's sha256 (``content``). A run made on the current
    file whose summary was never written (the driver stopped between the run's end and
    its summary) keeps its directory although the stored summary is stale.
    """
    path = run_dir / "data.json"
    if not provenance.get("sha256") or not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("content") == provenance["sha256"]
    except (OSError, ValueError, AttributeError):
        return False


def stale_reason(
    summary: dict, provenance: dict, steps: int, preset: str, expected: dict | None = None
) -> str | None:
    """Why a stored summary no longer counts (None: it does).

    ``expected``: :func:`expected_settings` of the variant; a CBOP summary made with other
    settings (e.g. before a preset changed its critics) no longer counts.
    """
    if summary.get("preset", preset) != preset:
        return f"made with preset={summary['preset']}, the benchmark now runs preset={preset}"
    if other_dataset(summary, provenance):
        return "made on another version of the dataset"
    if summary.get("gradient_steps", steps) != steps:
        return f"{summary['gradient_steps']} gradient steps, the benchmark now runs {steps}"
    recorded = (summary.get("diagnostics") or {}).get("settings")
    if expected is not None and recorded:
        differences = settings_differences(recorded_settings(summary, preset), expected)
        if differences:
            return "made with other settings (" + ", ".join(differences) + ")"
    return None


def keep_earlier_file_summary(summary_path: Path, summary: dict) -> Path:
    """Moves a summary made on an earlier file of its set beside the current file's rows.

    ``<set>/<variant>/seed<k>.json`` becomes ``<set>/<variant>-file-<sha12>/seed<k>.json``, so
    the rerun on the current file does not overwrite it: the report and ``rows.json`` still
    show the earlier file's row (named ``VARIANT (file SHA)`` by its recorded file), with all
    its seeds. Returns the new path.
    """
    sha = str((summary.get("dataset_provenance") or {}).get("sha256") or "unknown")[:12]
    kept = summary_path.parent.with_name(f"{summary_path.parent.name}-file-{sha}")
    kept.mkdir(parents=True, exist_ok=True)
    summary_path.replace(kept / summary_path.name)
    return kept / summary_path.name


def run_steps(run_dir: Path) -> int | None:
    """The gradient steps an existing run directory was started with (None: no run there)."""
    path = run_dir / "config.json"
    if not path.is_file():
        return None
    train = json.loads(path.read_text())["train"]
    return int(train["epochs"]) * int(train["steps_per_epoch"])


def continuation_source(run_dir: Path, base_dir: Path, steps: int) -> Path | None:
    """The unlabelled run ``base_dir`` when a new labelled ``run_dir`` should continue it.

    That is when ``run_dir`` does not exist yet and ``base_dir`` holds a checkpoint of a
    run of fewer than ``steps`` gradient steps (raising ``train.epochs`` continues a run).
    At the same budget a labelled run starts afresh (e.g. one with other overrides).
    """
    if run_dir == base_dir or run_dir.exists() or not (base_dir / "checkpoint.pt").is_file():
        return None
    started = run_steps(base_dir)
    return base_dir if started is not None and started < steps else None


def copy_run(source: Path, run_dir: Path) -> None:
    """``source``'s files in the new ``run_dir``, without its lock (the copy is not running)."""
    shutil.copytree(source, run_dir, ignore=shutil.ignore_patterns(".run.lock"))
    # A run made before runs were marked has no marker; the copy is this benchmark's run.
    (run_dir / MARKER_NAME).touch()


def git_commit() -> str:
    """``HEAD``'s hash, with ``+dirty`` when tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def run_command(
    variant: str, data: Path, seed: int, preset: str, run_dir: Path, args: argparse.Namespace
) -> list[str]:
    script, overrides = VARIANTS[variant]
    steps = variant_steps(variant, args)
    if steps % args.steps_per_epoch:
        raise BenchmarkInputError(
            f"{variant} needs {steps} gradient steps, not a multiple of "
            f"--steps-per-epoch {args.steps_per_epoch}; choose one that divides it"
        )
    command = [
        sys.executable,
        str(ROOT / "scripts" / script),
        f"env={data}",
        f"preset={preset}",
        f"seed={seed}",
        *overrides,
        f"hydra.run.dir={run_dir}",
        f"train.epochs={steps // args.steps_per_epoch}",
        f"train.steps_per_epoch={args.steps_per_epoch}",
        f"eval.interval={args.eval_interval}",
        "progress=false",
    ]
    if args.threads is not None:
        command.append(f"threads={args.threads}")
    if args.start_states:
        command.append(f"eval.start_states={args.start_states}")
    return command + list(args.overrides)


def portable_command(command: list[str]) -> str:
    """The command as run from the repository root, with the cache as ``$CBOP_TORCHRL_CACHE``."""
    cache = str(cache_dir())
    words = ["python", *(c.replace(str(ROOT) + "/", "") for c in command[1:])]
    return shlex.join(words).replace(cache, "$CBOP_TORCHRL_CACHE")


def add_score_measures(summary: dict, run_dir: Path) -> None:
    """Adds what the summary's score means and its noise (:func:`score_measures`) to ``summary``.

    ``final_measure``, ``last10_normalized_score``, ``last10_normalized_score_ci95``,
    ``eval_noise`` and, for a run evaluated from dataset states too, ``start_states``.
    """
    from cbop_torchrl.evaluation.analysis import score_measures

    results = json.loads((run_dir / "results.json").read_text())
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    evaluation = config.get("eval", {})
    summary.update(
        score_measures(
            results.get("eval_history", []),
            interval=int(evaluation.get("interval", 0)),
            episodes=int(evaluation.get("episodes", 0)),
            start_states=int(evaluation.get("start_states", 0) or 0),
        )
    )


def write_rows(results: Path, dataset: str) -> Path | None:
    """``<results>/<dataset>/rows.json``: every row's score and interval, by dataset file.

    Rows (:func:`~cbop_torchrl.evaluation.analysis.row_intervals`) are made from the
    summaries of ``<results>/<dataset>/<variant>/seed*.json``; summaries made on different
    versions of the dataset are different rows (each row's ``dataset_sha256``), so the rows
    of an earlier file stay readable beside the current file's. ``sha256`` names the current
    file: its provenance's, or, when the file is not on this machine, the report's choice
    (:func:`~cbop_torchrl.evaluation.summaries.current_files`: the file of the most recently
    finished summary), so rows.json and the report name one file. Not a summary (no
    ``summary_format``), so the report does not read it as one. None: no summaries.
    """
    from cbop_torchrl.evaluation.analysis import row_intervals
    from cbop_torchrl.evaluation.summaries import current_files

    provenance = dataset_provenance(dataset)
    summaries = []
    for path in find_regular_files(results / dataset, "seed*.json", depth=1):
        summary = json.loads(read_regular_text(path))
        if "variant" in summary and "seed" in summary:
            summaries.append(summary)
    if not summaries:
        return None
    sha256 = provenance.get("sha256")
    if not sha256:
        # current_files names a file by its first 12 characters; rows.json keeps the whole.
        current = current_files([{**s, "dataset": dataset} for s in summaries]).get(dataset)
        files = {(s.get("dataset_provenance") or {}).get("sha256") for s in summaries}
        sha256 = next((f for f in sorted(files, key=str) if f and f[:12] == current), None)
    path = results / dataset / ROWS_NAME
    rows = {
        "format": ROWS_FORMAT,
        "dataset": dataset,
        "sha256": sha256,
        "how": "python benchmarks/learning.py --rows --datasets " + dataset,
        "rule": "a row's final is the mean over its seeds of each run's mean of its last "
        "final_window evaluations (4 for a -50k row, 3 otherwise); two rows of one measure differ "
        "when |final_a - final_b| > t(0.975, df) * sqrt(final_se_a^2 + final_se_b^2), each se "
        "over the row's seeds (final_per_seed) and df Welch's (cbop_torchrl.evaluation.protocol."
        "resolution); a one-seed row has no se and no resolution; *_bootstrap_* describe the "
        "noise over seeds and evaluations and are never a resolution",
        "rows": row_intervals(summaries),
    }
    atomic_json_dump(rows, path)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.rows:
        for dataset in args.datasets:
            path = write_rows(args.results, dataset)
            print(f"[bench] rows     {dataset}: {path or 'no summaries'}")
        return 0
    deadline = None if args.max_minutes is None else time.time() + 60 * args.max_minutes
    sliced = deadline is not None or args.slice_steps is not None
    runs_root = args.runs or cache_dir("benchmark_runs")
    plan = [
        (dataset, seed, variant)
        for dataset in args.datasets
        for seed in args.seeds
        for variant in args.algos
    ]
    grouping, why = choose_grouping(
        args.grouping, sliced, read_records(), this_machine(device_kind(args.overrides))
    )
    jobs: dict[tuple[str, str], dict] = {}  # side by side: (dataset, variant) -> its runs
    pending: list[PendingRun] = []  # whole runs, trained after the loop
    # Composed once per variant (a Hydra compose each), not once per dataset and seed.
    settings = {v: expected_settings(v, args.preset, list(args.overrides)) for v in args.algos}
    for dataset, seed, variant in plan:
        name = variant_name(variant, args.preset, args.label)
        summary_path = args.results / dataset / name / f"seed{seed}.json"
        provenance = dataset_provenance(dataset)
        data_key = provenance.get("data_key") or "unversioned"
        runs_here = runs_root / dataset / data_key / args.preset
        run_dir, base_dir = (
            runs_here / name / f"seed{seed}",
            runs_here / variant_name(variant, args.preset, None) / f"seed{seed}",
        )
        expected, steps = settings[variant], variant_steps(variant, args)
        if summary_path.is_file():
            stored = json.loads(summary_path.read_text())
            why = stale_reason(stored, provenance, steps, args.preset, expected)
            if why is None:
                print(f"[bench] done     {dataset} {name} seed {seed}: {summary_path}")
                continue
            print(f"[bench] stale    {summary_path}: {why}")
            if other_dataset(stored, provenance) and not args.dry_run:
                kept = keep_earlier_file_summary(summary_path, stored)
                print(f"[bench] keeping  it as {kept} (a row of the earlier file)", flush=True)
                if run_dir.exists() and not run_on_current_file(run_dir, provenance):
                    # Another dataset: start that run over (another budget extends or
                    # restarts it).
                    run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{int(time.time())}"))
        differences = run_settings_differences(run_dir, expected)
        if differences and not args.dry_run:
            # Made with other settings (e.g. an older preset): it cannot be resumed; start over.
            print(f"[bench] moving   {run_dir} aside: {', '.join(differences)}", flush=True)
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{int(time.time())}"))
        started = run_steps(run_dir)
        source = continuation_source(run_dir, base_dir, steps)
        if source is not None and run_settings_differences(source, expected):
            source = None  # another algorithm's run: the labelled run starts afresh
        if source is not None and not args.dry_run:
            print(f"[bench] copying  {source} -> {run_dir} to continue it", flush=True)
            copy_run(source, run_dir)
            started = run_steps(run_dir)
        if started is not None and started > steps and not args.dry_run:
            # A smaller budget cannot shrink a run: start over (raising it continues the run).
            print(f"[bench] moving   {run_dir} aside: it ran {started} gradient steps")
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{int(time.time())}"))
        if args.dry_run:
            state = "resume" if (run_dir / "checkpoint.pt").is_file() else "start"
            if started is not None and started != steps:
                state = "extend" if started < steps else "restart"
            origin = f" (a copy of {source})" if source is not None else ""
            state = "continue" if source is not None else state
            state = "restart" if differences else state
            print(f"[bench] {state:8} {dataset} {name} seed {seed} -> {run_dir}{origin}")
            continue
        data = ensure_dataset(dataset)
        if not provenance and dataset_provenance(dataset):
            return main(argv)  # just generated: its version now names the run directories
        command = run_command(variant, data, seed, args.preset, run_dir, args)
        if grouping == "side-by-side" and VARIANTS[variant][0] == "cbop.py":
            job = jobs.setdefault((dataset, name), {"command": command, "runs": []})
            job["runs"].append((seed, run_dir, summary_path))
            continue
        if not sliced:
            where = (run_dir, summary_path, dataset, name, seed)
            label = f"{dataset} {name} seed {seed}"
            pending.append(PendingRun(label, command, partial(finish_run, where, args)))
            continue
        if deadline is not None and time.time() >= deadline:
            print(resume_message(argv, f"the --max-minutes {args.max_minutes:g} budget is spent"))
            return 0
        print(f"[bench] running  {shlex.join(command)}", flush=True)
        start = time.time()
        run_dir.mkdir(parents=True, exist_ok=True)
        outcome = run_slice(command, run_dir, args, deadline)
        if outcome.returncode == SLICE_EXIT_CODE:
            where = slice_end_label(outcome, steps)
            print(
                resume_message(argv, f"slice ended: {dataset} {name} seed {seed} stopped {where}"),
                flush=True,
            )
            return 0
        finish_run((run_dir, summary_path, dataset, name, seed), args, command,
                   outcome.returncode, start)  # fmt: skip
    if len(pending) + len(jobs) > 1 or any(len(job["runs"]) > 1 for job in jobs.values()):
        print(f"[bench] grouping {grouping}: {why}", flush=True)
    run_pending(pending, grouping, args)
    run_side_by_side_jobs(jobs, args)
    return 0


def run_pending(pending: list[PendingRun], grouping: str, args: argparse.Namespace) -> None:
    """Trains the whole runs the loop queued: in processes, or one after another."""
    workers = min(args.workers or default_workers(args.threads), len(pending))
    if grouping != "processes" or workers < 2:
        for run in pending:
            print(f"[bench] running  {shlex.join(run.command)}", flush=True)
            start = time.time()
            returncode = subprocess.run(run.command, cwd=ROOT, check=False).returncode
            run.finish(run.command, returncode, start)
        return
    if args.threads is None:  # share the cores out instead of each run taking them all
        share = f"threads={max(1, (os.cpu_count() or 1) // workers)}"
        pending = [run._replace(command=[*run.command, share]) for run in pending]
    print(f"[bench] {len(pending)} runs, {workers} processes at once", flush=True)
    run_in_processes(pending, workers)


def finish_run(
    where: tuple[Path, Path, str, str, int],
    args: argparse.Namespace,
    command: list[str],
    returncode: int,
    start: float,
) -> None:
    """After a run's process ended: its summary, or a note that it failed and resumes."""
    run_dir, summary_path, dataset, name, seed = where
    if returncode != 0:
        print_failed(dataset, name, seed, returncode)
        return
    write_summary(run_dir, summary_path, dataset, name, seed, command, start, args)


def print_failed(dataset: str, name: str, seed: int, returncode: int) -> None:
    print(
        f"[bench] FAILED   {dataset} {name} seed {seed} (exit {returncode});"
        " moving on (re-run to resume it)",
        flush=True,
    )


def run_side_by_side_jobs(jobs: dict, args: argparse.Namespace) -> None:
    """``--side-by-side``: each CBOP variant's pending seeds on a dataset as one job."""
    for (dataset, name), job in jobs.items():
        seeds = [seed for seed, _, _ in job["runs"]]
        job_dir = job["runs"][0][1].parent
        command = side_by_side_command(job["command"], seeds, job_dir)
        claim_job_dir(job_dir)
        print(f"[bench] running  {shlex.join(command)}", flush=True)
        start = time.time()
        returncode = subprocess.run(command, cwd=ROOT, check=False).returncode
        for seed, run_dir, summary_path in job["runs"]:
            if not (run_dir / "results.json").is_file():
                print_failed(dataset, name, seed, returncode)
                continue
            write_summary(run_dir, summary_path, dataset, name, seed, command, start, args)


def write_summary(
    run_dir: Path,
    summary_path: Path,
    dataset: str,
    name: str,
    seed: int,
    command: list[str],
    start: float,
    args: argparse.Namespace,
) -> None:
    """Writes a finished run's summary and its dataset's rows.json."""
    try:
        summary = summarize_run(run_dir, analysis=not args.no_analysis)
    except Exception as error:  # noqa: BLE001 - the finished run's summary must be written
        if args.no_analysis:
            raise
        # The checkpoint analysis failed (e.g. code changed under a long queue): keep the
        # run's scores; `--rows` and the report do not need the analysis.
        print(f"[bench] analysis failed ({type(error).__name__}: {error}); summary without it")
        summary = summarize_run(run_dir, analysis=False)
        summary["analysis_error"] = f"{type(error).__name__}: {error}"
    add_score_measures(summary, run_dir)
    summary["dataset"] = dataset
    summary["variant"] = name  # the config alone cannot tell cbop-fqe-rounds5 from cbop
    summary["command"] = portable_command(command)
    summary["commit"] = git_commit()
    summary["dataset_provenance"] = dataset_provenance(dataset)
    summary["session_wall_s"] = time.time() - start
    summary["finished_utc"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    summary["host"] = {"nproc": os.cpu_count(), "loadavg": os.getloadavg()}
    if (run_dir / "slices.json").is_file():  # a run made in slices (--max-minutes)
        summary["slices"] = json.loads((run_dir / "slices.json").read_text())
    atomic_json_dump(summary, summary_path)
    write_rows(args.results, dataset)
    print(
        f"[bench] finished {dataset} {name} seed {seed}: final "
        f"{summary['final_normalized_score']:.1f}, best {summary['best_normalized_score']:.1f}"
        f" ({summary['wall_time_s']:.0f} s) -> {summary_path}",
        flush=True,
    )


if __name__ == "__main__":
    run_main(main)
