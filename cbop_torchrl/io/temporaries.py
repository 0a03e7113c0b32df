"""Temporary files beside their final name, marked in use, and removed once abandoned.

Every temporary file or directory this package makes is named
``.<final name>.<8 random characters>.tmp`` and holds a shared ``flock`` while its maker
lives, so a later process can tell one a killed process left behind from one still being
written (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

TEMPORARY_SUFFIX = ".tmp"
"""Every temporary file or directory this package makes ends so, and starts with a dot:
``.<final name>.<random>.tmp`` (:func:`make_temporary`)."""

_TEMPORARY_NAME = re.compile(r"^\.[^/]+\.[A-Za-z0-9_]{8}\.tmp$")
STALE_AFTER_S = 60.0
"""A temporary this young is never removed (its maker may not have locked it yet)."""


def make_temporary(directory: Path, name: str, is_dir: bool = False) -> tuple[Path, int]:
    """A new temporary file or directory for ``directory/name`` and an fd holding its ``flock``.

    Named ``.<name>.<8 random characters>.tmp``; the shared ``flock`` on the
    returned descriptor marks it as in use until the descriptor is closed (or
    the process dies), which :func:`remove_stale_temporaries` checks.
    """
    import fcntl

    if is_dir:
        path = Path(tempfile.mkdtemp(dir=directory, prefix=f".{name}.", suffix=TEMPORARY_SUFFIX))
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    else:
        fd, name_ = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=TEMPORARY_SUFFIX)
        path = Path(name_)
    with contextlib.suppress(OSError):  # a file system without locks: the age check remains
        fcntl.flock(fd, fcntl.LOCK_SH)
    return path, fd


def remove_stale_temporaries(directory: str | Path) -> list[str]:
    """Removes temporaries left in ``directory`` by a killed process; returns their names.

    Only entries named as :func:`make_temporary` names them, at least
    :data:`STALE_AFTER_S` old, that are not links, and whose ``flock`` can be
    taken (no live process holds them) are removed; anything else stays.
    """
    import fcntl

    removed = []
    directory = Path(directory)
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not _TEMPORARY_NAME.match(entry.name) or entry.is_symlink():
            continue
        try:
            if now - entry.lstat().st_mtime < STALE_AFTER_S:
                continue
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if entry.is_dir() else 0)
            fd = os.open(entry, flags)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a live process (or not lockable here): keep it
            os.close(fd)
            continue
        try:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
        finally:
            os.close(fd)
    return removed


def open_own_file(path: str | Path) -> Any:
    """Opens ``path`` for reading and writing (a text file), creating it, never through a link.

    ``O_NOFOLLOW`` refuses a symlink and nothing is truncated on open, so a lock
    or record file planted as a link can never redirect a write.

    Raises:
        OSError: ``path`` is a link or not a regular file.
    """
    import stat

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "r+")
