"""Offline choice of psi (or any swept setting) by fitted Q evaluation of each trained policy.

    python scripts/select_psi.py sweep_dir=sweeps/paper_grid
    python scripts/select_psi.py sweep_dir=multirun steps=20000 device=cuda

The program is :mod:`cbop_torchrl.apps.select_psi`; installed with the package it is also the
console script ``cbop-select-psi`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("select_psi"))
