"""The full-size data benchmark, ``benchmarks/large_dataset.py``, run as a child process.

Its ``large_dataset_*`` figures, goals and load average are copied into the report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.speed import REPO

#: ``--large-dataset-dynamics-rows`` default: the README's ``large_dataset.py`` command.
LARGE_DATASET_DYNAMICS_ROWS = 200_000
#: ``benchmarks/large_dataset.py`` refuses fewer dynamics rows than one episode.
LARGE_DATASET_MIN_ROWS = 1000


def large_dataset_command(transitions: int, dynamics_rows: int, out: Path) -> list[str]:
    """The ``benchmarks/large_dataset.py`` command line (``dynamics_rows`` 0: all rows)."""
    script = REPO / "benchmarks" / "large_dataset.py"
    command = [sys.executable, str(script), "--transitions", str(transitions)]
    if dynamics_rows:
        command += ["--dynamics-rows", str(dynamics_rows)]
    return [*command, "--json", str(out)]


def large_dataset_figures(transitions: int, dynamics_rows: int) -> dict:
    """The report's ``large_dataset_*`` keys from one run on ``transitions`` transitions."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "large.json"
        command = large_dataset_command(transitions, dynamics_rows, out)
        subprocess.run(command, check=True)
        large = json.loads(out.read_text())
    figures = {k: v for k, v in large.items() if k.startswith("large_dataset_")}
    figures["large_dataset_transitions"] = large["transitions"]
    figures["large_dataset_goals"] = large["goals"]
    figures["large_dataset_load_average"] = large["load_average_start"]
    return figures
