"""The analysis report: results table, learning curves and the paper's figures.

    python scripts/report.py paths=benchmarks/results
    python scripts/report.py paths=runs/hopper-medium-replay-gen/cpu out=report/

The program is :mod:`cbop_torchrl.apps.report`; installed with the package it is also the
console script ``cbop-report`` (same arguments, any working directory).
"""

import sys

from cbop_torchrl.apps import launch

if __name__ == "__main__":
    sys.exit(launch("report"))
