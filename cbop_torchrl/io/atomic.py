"""Atomic writes: a reader sees the old file or the whole new one, never a partial write.

Each write goes to a temporary beside its file (:func:`~cbop_torchrl.io.make_temporary`),
is synced, then renamed onto the file; :func:`deferred_replace` renames a batch of them
together. A guard (:func:`guarded_writes`; :func:`cbop_torchrl.io.owned_outputs` is the
one the package uses) may check each file before it is written and record it after.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from cbop_torchrl.io.failures import (
    check_free_space,
    disk_full_error,
    nearly_full,
    tensor_bytes,
    write_failure,
    write_refused,
)
from cbop_torchrl.io.folders import make_dirs
from cbop_torchrl.io.temporaries import make_temporary


class WriteGuard(Protocol):
    """What :func:`atomic_write` asks about the files a guard covers."""

    def covers(self, path: Path) -> bool:
        """Whether the guard watches writes to ``path``."""

    def check(self, path: Path) -> None:
        """Raises when ``path`` may not be written (before anything is)."""

    def record(self, path: Path) -> None:
        """Notes that ``path`` was written (after its rename)."""


_guards: list[WriteGuard] = []


@contextlib.contextmanager
def guarded_writes(guard: WriteGuard) -> Iterator[None]:
    """While active, :func:`atomic_write` checks every file ``guard`` covers before writing
    it and records it after (the innermost guard that covers a file decides)."""
    _guards.append(guard)
    try:
        yield
    finally:
        _guards.remove(guard)


def _guard_of(path: Path) -> WriteGuard | None:
    if not _guards:
        return None
    return next((guard for guard in reversed(_guards) if guard.covers(path)), None)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Calls ``write(tmp_path)`` and renames the result onto ``path``.

    A reader sees either the old file or the complete new one, never a partial
    write, even if the process is killed in between (its temporary,
    ``.<name>.<random>.tmp``, is removed by :func:`~cbop_torchrl.io.remove_stale_temporaries`
    later). Never through a link: a folder on the way from a write root (the cache, a
    claimed run directory) to ``path`` that is a link is refused
    (:func:`~cbop_torchrl.io.check_no_link`) before anything is created, and a link at
    ``path`` itself is replaced, not followed. A full disk raises
    :class:`~cbop_torchrl.io.DiskFullError` with the temporary removed; any other write
    the operating system refuses (a read-only file system, no permission, ...) raises
    :class:`~cbop_torchrl.io.WriteRefusedError` naming the file and the cause.
    """
    path = Path(path)
    make_dirs(path.parent)
    guard = _guard_of(path)
    if guard is not None:
        guard.check(path)
    try:
        tmp_path, fd = make_temporary(path.parent, path.name)
    except OSError as error:
        raise (write_failure(error, path.parent) or write_refused(error, path)) from None
    try:
        write(tmp_path)
        sync = os.open(tmp_path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            os.fsync(sync)
        finally:
            os.close(sync)
        # mkstemp creates 0600 files; give the result the usual umask-based permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        if _deferred is not None:  # renamed together when the batch ends (deferred_replace)
            _deferred.append((tmp_path, path, fd, guard))
            return path
        os.replace(tmp_path, path)
    except Exception as error:
        written = tmp_path.stat().st_size if tmp_path.exists() else None
        tmp_path.unlink(missing_ok=True)
        os.close(fd)
        failure = write_failure(error, path.parent, written=written)
        # torch.save reports a full disk as a RuntimeError ("file write failed"): a failed
        # write on a file system that is now nearly full is taken for one.
        if failure is None and nearly_full(path.parent):
            failure = disk_full_error(path.parent)
        if failure is None and isinstance(error, OSError):
            failure = write_refused(error, path)
        if failure is not None and failure is not error:
            raise failure from None
        raise
    tmp_path.unlink(missing_ok=True)
    os.close(fd)
    if guard is not None:
        guard.record(path)
    return path


_deferred: list[tuple[Path, Path, int, WriteGuard | None]] | None = None


@contextlib.contextmanager
def deferred_replace() -> Iterator[None]:
    """Every :func:`atomic_write` inside the block writes its temporary, and all of them are
    renamed onto their files only when the block ends without an error; on an error (a full
    disk half way through a report) every temporary is removed and no file changed, so a
    folder never holds a mix of new and old outputs."""
    global _deferred
    outer, _deferred = _deferred, []
    batch = _deferred
    try:
        yield
    except BaseException:
        _deferred = outer
        for tmp_path, _, fd, _ in batch:
            tmp_path.unlink(missing_ok=True)
            os.close(fd)
        raise
    _deferred = outer
    try:
        for tmp_path, path, _, _ in batch:
            try:
                os.replace(tmp_path, path)
            except OSError as error:
                raise (write_failure(error, path.parent) or write_refused(error, path)) from None
    finally:
        for tmp_path, _, fd, _ in batch:
            tmp_path.unlink(missing_ok=True)
            os.close(fd)
    for _, path, _, guard in batch:
        if guard is not None:
            guard.record(path)


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` through :func:`atomic_write`, after checking the free space for its tensors.

    Load with ``weights_only=True``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path.parent, tensor_bytes(obj))
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_json_dump(obj: Any, path: str | Path) -> Path:
    """Writes ``obj`` as indented JSON through :func:`atomic_write`."""

    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")

    return atomic_write(path, write)
