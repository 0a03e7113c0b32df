"""Scores the snapshots of runs trained with eval.snapshot_interval, on the CPU.

    python scripts/score.py paths=gpu-runs/halfcheetah-medium-replay-gen
    python scripts/score.py paths=[runs/a,runs/b] results=benchmarks/results

The program is :mod:`cbop_torchrl.apps.score`; installed with the package it is also the
console script ``cbop-score`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("score"))
