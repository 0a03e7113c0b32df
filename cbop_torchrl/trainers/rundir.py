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
import shlex
import shutil
import socket
from pathlib import Path
from typing import Any

from cbop_torchrl.io import (
    add_write_root,
    atomic_json_dump,
    atomic_write,
    check_free_space,
    read_regular_json,
    remove_stale_temporaries,
)
from cbop_torchrl.trainers.checkpoint import (
    DATA_RECORD_NAME,
    CheckpointError,
    read_data_record,
)

LOCK_NAME = ".run.lock"

#: Written when a run first takes a directory (:func:`claim_run_dir`): a run only
#: removes or overwrites files in a directory that holds it.
MARKER_NAME = ".cbop-run"


#: What a run writes into its directory; ``resume=false`` clears these (Hydra's
#: ``.hydra/`` of the new command and the lock stay).
RUN_OUTPUTS = (
    "checkpoint.pt",
    "policy.pt",
    "policy.pt2",
    "results.json",
    "config.json",
    "dynamics_metrics.json",
    DATA_RECORD_NAME,
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
        handle = _open_own_file(self.path)
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


def _open_own_file(path: Path):  # noqa: ANN202 - a text file object
    """Opens ``path`` for reading and writing, creating it, without following a link.

    ``O_NOFOLLOW`` refuses a symlink at ``path`` (so the later truncation can only
    ever empty this regular file, never a link's target), and nothing is truncated
    on open.
    """
    import stat

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise CheckpointError(
            f"cannot open the run lock {str(path)!r} ({error.strerror}); it must be a regular "
            "file written by cbop-torchrl, not a link. Remove it or use another run directory "
            "(hydra.run.dir=...)."
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(
            f"the run lock {str(path)!r} is not a regular file; remove it or use another "
            "run directory (hydra.run.dir=...)."
        )
    return os.fdopen(fd, "r+")


def claim_run_dir(run_dir: str | Path, needed_bytes: int = 0) -> None:
    """Creates ``run_dir``, or checks that an existing one is a run's; then marks it as one.

    A run directory holds :data:`MARKER_NAME`, written here before the run writes
    anything else; the marker alone makes a folder a run's (never what the folder holds,
    however much it looks like a run's outputs). A folder that already holds any file and
    no marker is refused (:func:`foreign_files`), so a run never removes or overwrites a
    file it did not write. Its file system must have ``needed_bytes`` (a checkpoint) plus the
    margin every write keeps free, checked here, before any stage runs. Once claimed, the
    directory is a write root: nothing is written through a link below it
    (:func:`cbop_torchrl.io.check_no_link`).

    Raises:
        CheckpointError: ``run_dir`` is not a directory, or holds other files and no marker.
        DiskFullError: too little free space for a checkpoint and the margin.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(
            f"the run directory {str(run_dir)!r} exists and is not a directory; pass another "
            "run directory (hydra.run.dir=...)."
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"cannot create the run directory {str(run_dir)!r} ({error.strerror}); pass a run "
            "directory you can write to (hydra.run.dir=...)."
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise CheckpointError(
            f"the run directory {str(run_dir)!r} is not writable by this user; pass a run "
            "directory you can write to (hydra.run.dir=...)."
        )
    check_free_space(run_dir, needed_bytes)  # before any stage: not after training
    marker = run_dir / MARKER_NAME
    add_write_root(run_dir)
    if _is_regular_file(marker):
        linked = [name for name in (*RUN_OUTPUTS, ".hydra") if (run_dir / name).is_symlink()]
        if linked:  # a run would write through them (its logs) or replace them
            raise CheckpointError(
                f"the run directory {str(run_dir)!r} holds links where a run writes its own "
                f"outputs ({', '.join(linked)}); a run never writes through a link, and "
                "nothing was written. Remove those links (their targets are not needed) or "
                "pass another run directory (hydra.run.dir=...)."
            )
        for directory in (run_dir, run_dir / "logs"):  # left by a run killed mid-write
            remove_stale_temporaries(directory)
        write_hydra_files(run_dir)
        return
    if foreign := foreign_files(run_dir):
        raise foreign_run_dir_error(run_dir, foreign)
    _create_marker(marker)
    write_hydra_files(run_dir)


def foreign_files(run_dir: str | Path) -> list[str]:
    """The names in ``run_dir`` that make it another program's folder: everything in it,
    when it holds no marker; empty when it is absent, empty or marked as a run's.

    Nothing a program writes before the run takes the folder counts as its own: Hydra
    writes nothing there before (:mod:`cbop_torchrl.cli.guard`), so a ``.hydra/`` or a
    ``*.log`` in an unmarked folder is another Hydra application's. A lock file alone
    proves nothing (anyone can leave an empty ``.run.lock``), nor do files named like a
    run's outputs, nor a checkpoint this package can read: only the marker does.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or _is_regular_file(run_dir / MARKER_NAME):
        return []
    return sorted(entry.name for entry in run_dir.iterdir())


def foreign_run_dir_error(run_dir: str | Path, foreign: list[str]) -> CheckpointError:
    """The refusal of a folder holding ``foreign`` files (:func:`foreign_files`)."""
    marker = Path(run_dir) / MARKER_NAME
    shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
    earlier = ""
    if LOCK_NAME in foreign and "checkpoint.pt" in foreign:
        earlier = (
            " If it is the run directory of a cbop-torchrl version from before the marker "
            f"and holds nothing of yours, mark it: touch {shlex.quote(str(marker))}, then "
            "run the same command again."
        )
    return CheckpointError(
        f"the run directory {str(run_dir)!r} already holds files that no cbop-torchrl run "
        f"wrote there ({shown}): it has no {MARKER_NAME} marker (the marker alone makes a "
        "folder a run's, never files that look like a run's outputs or another Hydra "
        "application's .hydra/ and log), and a run may remove or overwrite its own files. "
        f"Nothing was written there. Pass an empty or new run directory (hydra.run.dir=...)."
        f"{earlier}"
    )


_existing_ancestor: dict[Path, Path] = {}


def note_run_dir(run_dir: str | Path) -> None:
    """Records the nearest folder of ``run_dir`` (itself included) that exists now, before
    Hydra creates it (the entry points' guard), so that a refused command removes only
    folders it made (:func:`existing_ancestor`)."""
    path = Path(run_dir).resolve()
    _existing_ancestor[path] = next(p for p in (path, *path.parents) if p.exists())


def existing_ancestor(run_dir: str | Path) -> Path | None:
    """The nearest folder of ``run_dir`` that existed before this command
    (:func:`note_run_dir`): ``run_dir`` itself when this command did not make it; None when
    unknown (a multirun's job folder, made by Hydra's launcher)."""
    return _existing_ancestor.get(Path(run_dir).resolve())


_HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")

_hydra_job: dict[str, Any] = {}


def remember_hydra_job(task_config: Any, hydra_config: Any) -> None:
    """Keeps the job's config and Hydra's for :func:`write_hydra_files` (set by the entry
    points, whose Hydra writes nothing into the run directory itself: ``output_subdir``
    is null, so nothing lands in a folder before it is known to be a run's)."""
    _hydra_job.clear()
    _hydra_job.update(task=task_config, hydra=hydra_config)


def write_hydra_files(run_dir: Path) -> None:
    """Writes Hydra's record of the command (``.hydra/config.yaml``, ``hydra.yaml``,
    ``overrides.yaml``) into a claimed run directory, atomically and never through a link.

    Only for the Hydra job whose output directory ``run_dir`` is; nothing otherwise.
    """
    if not _hydra_job:
        return
    from omegaconf import OmegaConf

    hydra_config = _hydra_job["hydra"]
    output_dir = OmegaConf.select(hydra_config, "hydra.runtime.output_dir")
    if output_dir is None or Path(output_dir).resolve() != Path(run_dir).resolve():
        return
    folder = Path(run_dir) / ".hydra"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise CheckpointError(
            f"{str(folder)!r} is a link or not a folder; a run writes Hydra's record of its "
            "command there. Remove it or pass another run directory (hydra.run.dir=...)."
        )
    folder.mkdir(exist_ok=True)
    texts = {
        "config.yaml": OmegaConf.to_yaml(_hydra_job["task"]),
        "hydra.yaml": OmegaConf.to_yaml(hydra_config),
        "overrides.yaml": OmegaConf.to_yaml(hydra_config.hydra.overrides.task),
    }
    for name in _HYDRA_FILES:
        atomic_write(folder / name, lambda tmp, text=texts[name]: tmp.write_text(text))


def _is_regular_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _create_marker(marker: Path) -> None:
    """Creates the (empty) marker unless it is there; never follows a link or truncates."""
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    except FileExistsError:
        if not _is_regular_file(marker):
            raise CheckpointError(
                f"{str(marker)!r} is not a regular file; pass another run directory "
                "(hydra.run.dir=...)."
            ) from None


def clear_previous_run(run_dir: str | Path) -> list[str]:
    """Removes a previous run's outputs from ``run_dir`` (``resume=false``); returns their names.

    Without this a new run in the same directory would append its rows to the old
    CSV files and report the old run's results if it were interrupted.
    """
    run_dir = Path(run_dir)
    if not _is_regular_file(run_dir / MARKER_NAME):
        raise CheckpointError(
            f"{str(run_dir)!r} is not marked as a cbop-torchrl run directory; nothing removed"
        )
    removed = []
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_symlink():  # remove the link, never what it points to
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def check_run_data(
    run_dir: str | Path,
    record: dict[str, Any],
    continuing: bool,
    checkpoint: dict[str, Any] | None = None,
) -> None:
    """Refuses to continue a run on other data than it started with; records the data.

    ``record`` (:func:`cbop_torchrl.data.data_record`) is the data given now. When the run
    is ``continuing`` (a checkpoint is resumed, or a finished run would be reported) it is
    compared by its ``content`` with what the run trained on: the record inside the
    ``checkpoint`` (every checkpoint carries one) and ``run_dir/data.json``. A ``data.json``
    that is there but unreadable, or missing while the checkpoint records no data either, is
    refused: which data the run started on is then unknown, and that is never read as
    "the same". A run that starts afresh gets ``record`` written.

    Raises:
        CheckpointError: the stored record names other data (both are described), or it
            cannot be known which data the run started on.
    """
    path = Path(run_dir) / DATA_RECORD_NAME
    if not continuing:
        atomic_json_dump(record, path)
        return
    in_checkpoint = (checkpoint or {}).get("data")
    in_checkpoint = in_checkpoint if isinstance(in_checkpoint, dict) else None
    stored = read_data_record(Path(run_dir))
    ways_out = (
        "Pass a new run directory (hydra.run.dir=...) to train on this data, or resume=false "
        "to start over in this one (its checkpoint, results and logs are removed)"
    )
    if stored is None and (os.path.lexists(path) or in_checkpoint is None):
        state = "is not a readable record" if os.path.lexists(path) else "is missing"
        raise CheckpointError(
            f"the run in {str(run_dir)!r} cannot be continued: its {DATA_RECORD_NAME} {state}"
            f"{'' if in_checkpoint else ' and its checkpoint records no data'}, so it is not "
            "known which data the run started on, and continuing it (or reporting it as "
            f"finished) could use other data than env={record.get('source')} held then. "
            f"{ways_out}."
        )
    for what in (in_checkpoint, stored):
        if what is not None and what.get("content") != record.get("content"):
            raise CheckpointError(
                f"the run in {str(run_dir)!r} was started on other data than "
                f"env={record.get('source')} holds now: it recorded {describe_data(what)}, "
                f"the data is now {describe_data(record)}. Continuing it would train (or "
                "report as finished) a run on data it did not start with. "
                f"{ways_out}, or restore the original data to continue the run."
            )
    if stored is None:  # the checkpoint's record is the run's: put the file back
        atomic_json_dump(in_checkpoint, path)


def read_run_json(path: str | Path) -> dict[str, Any] | None:
    """A run's own JSON output (``results.json``): None when there is none.

    Raises:
        CheckpointError: it is a link, not a regular file, or not a JSON object (a
            damaged or replaced file), naming it and the ways out.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return None
    value, problem = read_regular_json(path)
    if problem is None and not isinstance(value, dict):
        problem = "does not hold a JSON object"
    if problem is not None:
        raise CheckpointError(
            f"{str(path)!r} {problem}; a run writes it itself, so it was replaced or damaged. "
            "Remove it and run the same command again (the run resumes from its checkpoint "
            "and writes it afresh), or pass resume=false to start over in this directory."
        )
    return value


def describe_data(record: dict[str, Any]) -> str:
    """One phrase naming a :func:`cbop_torchrl.data.data_record`: name, hash, size, date."""
    parts = [f"content {str(record.get('content'))[:16]}"]
    if record.get("size_bytes") is not None:
        parts.append(f"{record['size_bytes']} bytes")
    if record.get("modified"):
        parts.append(f"modified {record['modified']}")
    if record.get("num_transitions") is not None:
        parts.append(f"{record['num_transitions']} transitions")
    return f"{record.get('name', '?')!r} ({', '.join(parts)})"
