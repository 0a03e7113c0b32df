"""The cache: its folders, the keys that name its entries, and the lock on an entry."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cbop_torchrl.io.folders import make_dirs
from cbop_torchrl.io.roots import cache_root
from cbop_torchrl.io.temporaries import open_own_file, remove_stale_temporaries


def cache_dir(*parts: str) -> Path:
    """A directory under :func:`~cbop_torchrl.io.cache_root`, created on demand."""
    return make_dirs(cache_root().joinpath(*parts))


def config_hash(config: Any, length: int = 12) -> str:
    """A stable short hash of a JSON-serializable config, used as a cache key."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


LOCK_REPORT_INTERVAL_S = 30.0
"""How often a process waiting for a cache entry's lock says so (seconds)."""

_LOCK_POLL_S = 0.5


@contextlib.contextmanager
def cache_entry_lock(directory: str | Path, what: str) -> Iterator[None]:
    """Holds an exclusive lock on a cache entry (``<directory>/.lock``) while it is read or made.

    Runs that share an entry (every psi of a sweep with one seed shares the BC,
    FQE and dynamics stages) then make it once: the first trains it, the others
    wait, say so (naming the holder's PID, every :data:`LOCK_REPORT_INTERVAL_S`
    seconds with the time waited), and read the finished entry. An OS file
    lock (``flock``), so a process that dies releases it; the lock file is
    opened without following a link and records the holder (``pid N on host``).
    Temporary files that a killed writer left in the entry are removed once the
    lock is held (:func:`~cbop_torchrl.io.remove_stale_temporaries`).
    """
    import fcntl

    path = Path(directory) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_own_file(path) as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait_for_lock(handle, f"the same {what} ({directory})")
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
            remove_stale_temporaries(path.parent)
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _wait_for_lock(handle: Any, what: str) -> None:
    """Blocks until ``handle``'s ``flock`` is taken, printing who holds it and for how long."""
    import fcntl

    start = time.monotonic()
    next_report = 0.0
    while True:
        waited = time.monotonic() - start
        if waited >= next_report:
            handle.seek(0)
            holder = handle.read().strip() or "not yet known"
            print(
                f"[cbop] waiting for another process that is making {what}: held by {holder}, "
                f"waited {waited:.0f} s so far (a stopped process keeps the lock until it is "
                "resumed or ended)", flush=True,
            )  # fmt: skip
            next_report = waited + LOCK_REPORT_INTERVAL_S
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(min(_LOCK_POLL_S, LOCK_REPORT_INTERVAL_S))
