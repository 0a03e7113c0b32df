"""The project's benchmarks: scripts run by hand, not part of the installed package.

A regular package (not a namespace one) so that the ``benchmarks`` directory torchrl
installs into site-packages is neither merged with it nor found in its place.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class BenchmarkInputError(ValueError):
    """Bad input to a benchmark script: its message says what is wrong and what would be right."""


def run_main(main: Callable[[], int]) -> None:
    """Run a benchmark's ``main`` and exit with its code; bad input prints its message, exit 2.

    The project's scripts end bad input the same way (one paragraph on stderr, exit code 2).
    """
    try:
        code = main()
    except BenchmarkInputError as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    sys.exit(code)
