"""Offline CBOP on one dataset: dynamics -> BC -> FQE -> CBOP, evaluation, results.json.

    python scripts/cbop.py                               # bundled demo data, CPU preset
    python scripts/cbop.py env=hopper-medium-replay-v2   # a D4RL id: the paper's settings
    python scripts/cbop.py preset=debug logger=tensorboard seed=1

The program is :mod:`cbop_torchrl.apps.cbop`; installed with the package it is also the
console script ``cbop-train`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("cbop"))
