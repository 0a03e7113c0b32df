"""Train (or fetch from the cache) the dynamics ensemble of one dataset and report its fit.

    python scripts/train_dynamics.py env=hopper-medium-replay-v2
    python scripts/train_dynamics.py env=/data/hopper.hdf5 dynamics.num_members=10 device=cuda

The program is :mod:`cbop_torchrl.apps.train_dynamics`; installed with the package it is also the
console script ``cbop-train-dynamics`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("train_dynamics"))
