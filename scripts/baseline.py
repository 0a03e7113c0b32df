"""A model-free offline baseline (BC, TD3+BC, IQL, CQL) on one dataset, CBOP's run format.

    python scripts/baseline.py algo=td3bc                 # bundled demo data, CPU preset
    python scripts/baseline.py algo=cql preset=debug algo.min_q_weight=10

The program is :mod:`cbop_torchrl.apps.baseline`; installed with the package it is also the
console script ``cbop-baseline`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("baseline"))
