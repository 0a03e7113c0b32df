"""How `learning.py` trains several runs: one at a time, in processes, or side by side.

- ``one``: one run after another, one process each (the only way in slices).
- ``processes``: up to ``--workers`` one-run processes at once (default: one per
  ``--threads`` share of the cores), each summarized as it finishes.
- ``side-by-side``: each CBOP variant's seeds on a dataset as one ``cbop-train
  runs.seeds=[...]`` job (:mod:`benchmarks.learning_jobs`); the baselines one at a time.
- ``auto``: whichever of ``processes`` and ``side-by-side`` was measured faster on a machine
  like this one by ``python scripts/bench.py --side-by-side --json <record>`` (the records
  in :data:`RECORDS`: the same device kind, CPU model and core count, or the same GPU).
  Without such a record: side by side on a GPU (runs in turn fill the device's idle
  time), processes on a CPU with more than one core (runs in turn share one core), one at a
  time otherwise.

The choice never changes what a run computes: each run is the run alone in every mode
(``tests/test_side_by_side.py``, ``tests/test_learning_grouping.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
GROUPINGS = ("auto", "one", "processes", "side-by-side")
RECORDS = (
    ROOT / "benchmarks" / "bench_side_by_side_cpu.json",
    ROOT / "benchmarks" / "bench_side_by_side_cuda.json",
)
"""The side-by-side measurements ``auto`` reads (``scripts/bench.py --side-by-side --json``)."""


def this_machine(device: str) -> dict:
    """What a side-by-side record must match: device kind, CPU model, cores, GPU name."""
    from benchmarks.speed.measure import host_cpu_info

    machine = {"device": device, "nproc": os.cpu_count(), "cpu_model": None, "gpu": None}
    machine["cpu_model"] = host_cpu_info().get("cpu_model")
    if device == "cuda":
        import torch

        machine["gpu"] = torch.cuda.get_device_name()
    return machine


def same_machine(recorded: dict, here: dict) -> bool:
    """Whether a record's ``machine`` is a machine like ``here`` (:func:`this_machine`)."""
    if recorded.get("device") != here["device"]:
        return False
    if here["device"] == "cuda":
        return recorded.get("gpu") == here["gpu"]
    return recorded.get("cpu_model") == here["cpu_model"] and recorded.get("nproc") == here["nproc"]


def faster_in_record(report: dict) -> str:
    """The grouping of the higher run-steps/s in a measured report.

    The best side-by-side row (any R) against two one-thread processes on the CPU
    (``side-by-side`` or ``processes``); on a GPU, where the report has no processes'
    figure, against one run alone (``side-by-side`` or ``one``: one GPU's processes would
    take turns on it too).
    """
    best_side_by_side, other, processes = 0.0, 0.0, False
    for entry in report["sizes"].values():
        rows = entry["side_by_side"]
        best_side_by_side = max(best_side_by_side, *(row["run_steps_per_s"] for row in rows))
        alone = next(row["run_steps_per_s"] for row in rows if row["runs"] == 1)
        processes = processes or "two_processes" in entry
        other = max(other, entry.get("two_processes", {}).get("run_steps_per_s", alone))
    if best_side_by_side > other:
        return "side-by-side"
    return "processes" if processes else "one"


def read_records(paths: Sequence[Path] = RECORDS) -> list[dict]:
    """The side-by-side reports on disk (a missing file is no record)."""
    return [json.loads(path.read_text()) for path in paths if path.is_file()]


def choose_grouping(
    requested: str, sliced: bool, records: Sequence[dict], here: dict
) -> tuple[str, str]:
    """The grouping to use and why, for ``requested`` (one of :data:`GROUPINGS`)."""
    if requested != "auto":
        return requested, "asked for"
    if sliced:
        return "one", "runs in slices go one at a time"
    for report in records:
        if same_machine(report.get("machine", {}), here):
            grouping = faster_in_record(report)
            return grouping, f"measured faster here ({report.get('command', 'scripts/bench.py')})"
    if here["device"] == "cuda":
        return "side-by-side", "no measurement for this GPU: runs in turn fill its idle time"
    if (here["nproc"] or 1) > 1:
        return "processes", "no measurement for this CPU: one process per core"
    return "one", "no measurement for this CPU, one core"


class PendingRun(NamedTuple):
    """A run the driver starts: its command and what to do once it ends."""

    label: str  # "<dataset> <variant> seed <k>", for the log
    command: list[str]
    finish: Callable[[list[str], int, float], None]  # (command, exit code, start time)


def run_in_processes(runs: Sequence[PendingRun], workers: int, poll_s: float = 0.5) -> None:
    """Runs ``runs`` as up to ``workers`` processes at once, each finished as it ends."""
    waiting, running = list(runs), []
    while waiting or running:
        while waiting and len(running) < workers:
            run = waiting.pop(0)
            print(f"[bench] running  {subprocess.list2cmdline(run.command)}", flush=True)
            running.append((run, subprocess.Popen(run.command, cwd=ROOT), time.time()))
        for entry in list(running):
            run, process, start = entry
            if process.poll() is not None:
                running.remove(entry)
                run.finish(run.command, process.returncode, start)
        if running:
            time.sleep(poll_s)


def default_workers(threads: int | None) -> int:
    """One process per ``threads`` cores (one per core without ``--threads``)."""
    return max(1, (os.cpu_count() or 1) // (threads or 1))


def device_kind(overrides: Sequence[str]) -> str:
    """``cuda`` or ``cpu``: where the runs train (their ``device=`` override, else auto)."""
    for word in overrides:
        if word.startswith("device="):
            value = word.split("=", 1)[1]
            if value != "auto":
                return "cuda" if value.startswith("cuda") else "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


__all__ = [
    "GROUPINGS",
    "PendingRun",
    "RECORDS",
    "choose_grouping",
    "default_workers",
    "device_kind",
    "faster_in_record",
    "read_records",
    "run_in_processes",
    "same_machine",
    "this_machine",
]
