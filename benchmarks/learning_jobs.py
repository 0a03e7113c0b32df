"""`learning.py --side-by-side`: a CBOP variant's seeds as one job of runs side by side.

The seeds of one CBOP variant on one dataset train in one ``cbop-train runs.seeds=[...]``
process (:mod:`cbop_torchrl.trainers.side_by_side`) instead of one process each. The job's
directory is the variant's folder, ``<runs>/<dataset>/<data key>/<preset>/<variant>``, whose
``seed<k>`` directories are the runs' usual ones, so a run is summarized, resumed and
compared exactly as when it ran alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from cbop_torchrl.trainers.rundir import MARKER_NAME


def side_by_side_command(command: list[str], seeds: list[int], job_dir: Path) -> list[str]:
    """``command`` (one seed's ``cbop.py`` command) for ``seeds`` side by side in ``job_dir``."""
    words = [word for word in command if not word.startswith(("seed=", "hydra.run.dir="))]
    return [
        *words,
        f"runs.seeds=[{','.join(str(seed) for seed in seeds)}]",
        f"hydra.run.dir={job_dir}",
    ]


def claim_job_dir(job_dir: Path) -> None:
    """Marks the variant's folder (made by this driver) as a run's, so the job may use it.

    It holds the seeds' run directories of earlier single runs; ``cbop-train`` accepts a
    folder with files only when it holds the marker (:func:`cbop_torchrl.trainers.rundir.
    claim_run_dir`).
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    marker = job_dir / MARKER_NAME
    if not marker.exists():
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


__all__ = ["claim_job_dir", "side_by_side_command"]
