"""Evaluates a saved policy and prints its normalized score (or its return).

    python scripts/evaluate.py checkpoint=runs/demo/cpu/default/policy.pt
    python scripts/evaluate.py checkpoint=runs/.../checkpoint.pt episodes=20 seed=1

The program is :mod:`cbop_torchrl.apps.evaluate`; installed with the package it is also the
console script ``cbop-evaluate`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("evaluate"))
