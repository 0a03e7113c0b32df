"""A run's place on this machine: the CPU threads it may use and its directory's name."""

from __future__ import annotations

import os
import re
from pathlib import Path


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def capped_threads(threads: int | None) -> tuple[int | None, str | None]:
    """``threads`` capped at :func:`usable_cores`, with a note when it was capped.

    More torch threads than cores only make them wait for each other (``threads=1000``
    ran 5x slower than the default).
    """
    cores = usable_cores()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads <= cores:
        return threads, None
    return cores, (
        f"threads={threads} is more than the {cores} CPU core{'s' * (cores != 1)} this process "
        f"may use; using threads={cores}"
    )


def run_name(env: str) -> str:
    """A file-system friendly name for a dataset source (used for run directories)."""
    text = str(env)
    if text.startswith("minari:"):
        text = text[len("minari:") :]
    elif text.endswith((".hdf5", ".h5")):
        text = Path(text).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "dataset"
