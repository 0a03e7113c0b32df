"""The run directory: one process at a time (a lock), and starting over (``resume=false``).

A run directory is named by its command (``runs/<dataset>/<preset>/<overrides>``),
so two copies of one command would write the same checkpoint and the same CSV
files. :class:`RunLock` lets the first one run and refuses the second at once,
naming the directory and the process that holds it.

The lock is an advisory ``flock`` on ``<run_dir>/.run.lock``, which also records
the holder's PID and host. The kernel releases a ``flock`` when its process
dies, however it dies (SIGKILL included), so a lock file left by a dead process
is simply taken over; the PID in the file is only there for the message. (On
network file systems Linux maps ``flock`` to POSIX byte-range locks, which NFS
supports through its lock manager.)
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from cbop_torchrl.trainers.checkpoint import CheckpointError

LOCK_NAME = ".run.lock"

#: What a run writes into its directory; ``resume=false`` clears these (Hydra's
#: ``.hydra/`` of the new command and the lock stay).
RUN_OUTPUTS = (
    "checkpoint.pt",
    "policy.pt",
    "policy.pt2",
    "results.json",
    "config.json",
    "dynamics_metrics.json",
    "logs",
)


class RunLockedError(CheckpointError):
    """Another live process holds the run directory.

    A :class:`~cbop_torchrl.trainers.checkpoint.CheckpointError`, so the entry
    scripts refuse it like any other run-directory problem (exit code 2).
    """


class RunLock:
    """An exclusive lock on a run directory, held until :meth:`release` or process exit.

    Args:
        run_dir: the run directory (created if missing).

    Raises:
        RunLockedError: another live process holds the lock.
    """

    def __init__(self, run_dir: str | Path) -> None:
        import fcntl

        self.path = Path(run_dir) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = None
        self.previous_holder: str | None = None
        handle = open(self.path, "a+")  # noqa: SIM115 - the lock lives as long as the handle
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RunLockedError(
                f"the run directory {str(self.path.parent)!r} is in use by another run "
                f"(process {holder}, lock file {str(self.path)!r}). Wait for it to finish, "
                "stop it, or run this command with another run directory "
                "(hydra.run.dir=...)."
            ) from None
        handle.seek(0)
        self.previous_holder = handle.read().strip() or None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        self._handle = handle

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Empties the lock file and releases the lock (closing the file releases the ``flock``).

        A lock file that still names a process when it is next acquired was left
        by a process that died holding it (:attr:`previous_holder`).
        """
        if self._handle is not None:
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.close()
            self._handle = None

    def __del__(self) -> None:
        self.release()


def clear_previous_run(run_dir: str | Path) -> list[str]:
    """Removes a previous run's outputs from ``run_dir`` (``resume=false``); returns their names.

    Without this a new run in the same directory would append its rows to the old
    CSV files and report the old run's results if it were interrupted.
    """
    run_dir = Path(run_dir)
    removed = []
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed
