"""Generate D4RL-recipe datasets on gymnasium MuJoCo ``*-v4`` (cbop_torchrl/configs/collect.yaml).

    python scripts/collect.py env=hopper kind=medium-replay seed=0
    python scripts/collect.py env=walker2d kind=[medium,medium-replay]

The program is :mod:`cbop_torchrl.apps.collect`; installed with the package it is also the
console script ``cbop-collect`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("collect"))
