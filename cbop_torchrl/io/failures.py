"""Failures of the file system and of memory, told apart and put in one paragraph each.

A full disk (:class:`DiskFullError`), a write the operating system refused
(:class:`WriteRefusedError`), a special file read as a file (:class:`SpecialFileError`),
a file the package did not write (:class:`ForeignFileError`) and an allocation that
failed: each is recognised however deep in a chain of errors it was raised, and each
message names the place, the cause and what to do.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cbop_torchrl.io.roots import cache_root, is_within, output_setting


class DiskFullError(OSError):
    """A write did not fit: no space (``ENOSPC``), the quota used up (``EDQUOT``) or a file
    past the largest size allowed (``EFBIG``: the file-size limit, ``ulimit -f``); the
    message names the place, the cause and what to do (:func:`write_failure`).
    """

    def __init__(self, message: str, number: int = errno.ENOSPC) -> None:
        super().__init__(number, message)

    def __str__(self) -> str:
        return str(self.args[1])


class WriteRefusedError(OSError):
    """The operating system refused a write (a read-only file system, no permission, a path
    too long, ...); the message names the file, the cause and what to do. Every entry point
    turns it (and any refused write, :func:`refused_write`) into one paragraph, exit 2."""

    def __str__(self) -> str:
        return str(self.args[1])


class SpecialFileError(OSError):
    """A program was to read a FIFO, socket, device or folder as a file
    (:func:`cbop_torchrl.io.read_regular_bytes`); every entry point refuses it with one
    paragraph."""

    def __str__(self) -> str:
        return (
            f"{str(self.filename)!r} is not a regular file ({self.strerror}); a program reads "
            "only files, never a FIFO (which would wait forever for a writer), socket or "
            "device. Replace it with the file it stands for, or move it out of the folders "
            "given, and run the same command again."
        )


class ForeignFileError(Exception):
    """A program would replace a file it did not write (or write through a link).

    Every entry point refuses it with its message and exit code 2
    (:func:`cbop_torchrl.cli.hydra_entry`).
    """


# ------------------------------------------------------------------------------ disk space

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""The writes that did not fit, each told as a full disk with its own cause."""
_ERROR_TEXTS = (
    ("No space left on device", errno.ENOSPC), ("Disk quota exceeded", errno.EDQUOT),
    ("File too large", errno.EFBIG), ("Read-only file system", errno.EROFS),
)  # fmt: skip
"""Errors that carry their cause in their text only (h5py's, a logger's)."""
RESERVE_BYTES = 16 << 20
"""Left free besides what a write needs (logs, other files)."""


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is a write that did not fit: no
    space, the quota, or a file past the size limit."""
    found = _write_errno(error)
    return found is not None and found[0] in _DISK_FULL_ERRNOS


def disk_full_error(
    where: str | Path, needed: int | None = None, cleaned: bool = True, number: int = errno.ENOSPC
) -> DiskFullError:
    """The :class:`DiskFullError` for a write into ``where`` (``needed`` bytes, if known;
    ``cleaned``: the caller removed what it had begun to write; ``number``: ENOSPC, EDQUOT
    or EFBIG, the cause)."""
    where = Path(where)
    if number != errno.ENOSPC:
        return _no_room_error(where, cleaned, number)
    existing = next((p for p in (where, *where.parents) if p.exists()), where)
    try:
        free = f"{shutil.disk_usage(existing).free / 1e6:.0f} MB free"
    except OSError:
        free = "an unknown amount of free space"
    margin = f"{RESERVE_BYTES >> 20} MB"
    size = (
        f"the write needs about {_megabytes(needed)} plus a {margin} margin that is kept free, and "
        if needed is not None
        else f"a {margin} margin is kept free beside every write, and "
    )
    hint = _room_hint(where)
    return DiskFullError(
        f"not enough disk space to write into {str(where)!r}: {size}its file system has "
        f"{free}.{' Nothing half-written was left there.' if cleaned else ''} Free some "
        f"space and run the same command again (a run resumes from its last checkpoint){hint}."
    )


def _no_room_error(where: Path, cleaned: bool, number: int) -> DiskFullError:
    """A quota used up (EDQUOT) or a file past the largest size allowed (EFBIG), told as a
    full disk: the place, the cause, that nothing is half-written, what to do."""
    if number == errno.EDQUOT:
        cause = "the disk quota of this user on its file system is used up (EDQUOT)"
        remedy = "Free some of your files there (or ask for a larger quota)"
    else:
        limit = file_size_limit()
        shown = (
            f"the file-size limit of this process (ulimit -f) is {limit} bytes"
            if limit
            else ("the file system allows no larger file")
        )
        cause = f"a file there would grow past the largest size allowed (EFBIG): {shown}"
        remedy = "Raise the limit (ulimit -f unlimited) or free the room"
    hint = _room_hint(where)
    return DiskFullError(
        f"not enough room to write into {str(where)!r}: {cause}."
        f"{' Nothing half-written was left there.' if cleaned else ''} {remedy}, and run the "
        f"same command again (a run resumes from its last checkpoint){hint}.",
        number,
    )


def file_size_limit() -> int | None:
    """The soft file-size limit of this process in bytes (``ulimit -f``), or None."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _room_hint(where: Path) -> str:
    if is_within(where, cache_root()):
        return (
            "; the cache may also move to a larger disk (CBOP_TORCHRL_CACHE=<folder>), and "
            "clearing it is safe"
        )
    return f", or write to another disk ({output_setting()}=<a folder there>)"


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{max(1, round(size / 1e3))} KB"


def as_disk_full_error(error: BaseException, default_dir: str | Path) -> DiskFullError:
    """``error`` (one :func:`is_disk_full` accepts) as a :class:`DiskFullError` naming the
    folder of the file it failed on, else ``default_dir`` (:func:`write_failure`)."""
    failure = write_failure(error, default_dir, cleaned=False)
    assert isinstance(failure, DiskFullError), "only for errors is_disk_full accepts"
    return failure


def nearly_full(directory: Path) -> bool:
    """Whether ``directory``'s file system has less than :data:`RESERVE_BYTES` free."""
    try:
        return shutil.disk_usage(directory).free < RESERVE_BYTES
    except OSError:
        return False


def check_free_space(directory: str | Path, needed: int) -> None:
    """Raises :class:`DiskFullError` when ``directory``'s file system lacks ``needed`` bytes
    (plus a small reserve), before anything is written; unknown free space passes."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < needed + RESERVE_BYTES:
        raise disk_full_error(directory, needed)


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor/array in a nested dict/list/tuple (an estimate of its file size)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(value) for value in obj)
    return 0


# ---------------------------------------------------------------------------------- memory


def is_out_of_memory(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is an allocation that failed."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
            return True
        text = str(error)
        if isinstance(error, RuntimeError) and (
            "can't allocate memory" in text or "out of memory" in text.lower()
        ):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def out_of_memory_message(error: BaseException) -> str:
    """One paragraph for :func:`is_out_of_memory`: what ran out and what to lower."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (
        f"the run ran out of memory ({first[:200]}): its sizes need more than this process "
        "may use (the machine's memory, or a limit set by ulimit -v or a cgroup). Lower the "
        "largest sizes (agent.num_qvalue_nets, agent.hidden_sizes, the batch sizes, "
        "estimator.horizon, eval.episodes) or run where more memory is available; a run "
        "resumes from its last checkpoint."
    )


# -------------------------------------------------------------------------- refused writes

_WRITE_REFUSALS = {
    errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.ELOOP,
    errno.ENAMETOOLONG, errno.EFBIG, errno.EMLINK, errno.ETXTBSY, errno.EEXIST, errno.EIO,
    errno.ENXIO, errno.ENODEV,
}  # fmt: skip


def _write_hint(where: Path) -> str:
    if is_within(where, cache_root()):
        return (
            "point the cache at a folder you can write to (CBOP_TORCHRL_CACHE=<folder>; "
            "clearing or moving the cache is safe)"
        )
    return (
        f"make it writable, or write somewhere else ({output_setting()}=<a writable folder "
        "or file>)"
    )


def write_refused(error: OSError, path: str | Path | None = None) -> WriteRefusedError:
    """``error`` (refused by the OS) as a :class:`WriteRefusedError` naming the file
    (``error.filename``, else ``path``), the OS's cause and what to do."""
    if isinstance(error, WriteRefusedError):
        return error
    name = error.filename or path or "a file"
    cause = error.strerror or str(error)
    code = errno.errorcode.get(error.errno or -1)
    where = Path(str(name))
    return WriteRefusedError(
        error.errno or errno.EIO,
        f"cannot write {str(name)!r}: the operating system refused it ({cause}"
        f"{f', {code}' if code else ''}). Nothing half-written was left there; "
        f"{_write_hint(where if where.is_dir() else where.parent)}, and run the same "
        "command again.",
    )


_H5_ERRNO = re.compile(r"name = '(?P<name>[^']*)'(?:[^']*?), errno = (?P<errno>\d+)")


def _write_errno(error: BaseException | None) -> tuple[int, str | None] | None:
    """``(errno, file name or None)`` of the first error in ``error``'s chain that is a write
    the user's system stopped (:data:`_DISK_FULL_ERRNOS`, :data:`_WRITE_REFUSALS`), read
    from its ``errno`` or, for h5py's and some loggers' errors, from its text; else None."""
    seen = 0
    while error is not None and seen < 16:
        number = getattr(error, "errno", None) if isinstance(error, OSError) else None
        name = getattr(error, "filename", None) if isinstance(error, OSError) else None
        text = str(error)
        if (match := _H5_ERRNO.search(text)) is not None:
            number, name = int(match["errno"]), match["name"]
        if number is None:
            number = next((code for words, code in _ERROR_TEXTS if words in text), None)
        if number in _DISK_FULL_ERRNOS or (number in _WRITE_REFUSALS and name):
            return int(number), None if name is None else str(name)
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def write_failure(
    error: BaseException | None,
    where: str | Path,
    needed: int | None = None,
    cleaned: bool = True,
    written: int | None = None,
) -> OSError | None:
    """The one paragraph for any write the user's system stopped, wherever it was raised:
    the one place every program's failed write (checkpoints, results, logs, caches, h5py's
    and torch's) is told, all in the shape of a full disk (the file or folder, the cause,
    that nothing half-written was left, what to do).

    No space, a quota used up or a file past the size limit (``ulimit -f``; Python ignores
    SIGXFSZ, so the write fails with EFBIG) is a :class:`DiskFullError`; a read-only file
    system, no permission and the other refusals (:data:`_WRITE_REFUSALS`) a
    :class:`WriteRefusedError`; a special file read as a file stays its
    :class:`SpecialFileError`. ``where``: the folder written into when the error names no
    file; ``written``: the bytes the failed file had reached, for writers that give no cause
    (``torch.save`` reports "unexpected pos"): at the file-size limit it is EFBIG. None when
    ``error`` is no such failure.
    """
    seen, chained = 0, error
    while chained is not None and seen < 16:
        if isinstance(chained, (DiskFullError, WriteRefusedError, SpecialFileError)):
            return chained
        chained, seen = chained.__cause__ or chained.__context__, seen + 1
    found = _write_errno(error)
    limit = file_size_limit()
    if found is None and written is not None and limit is not None and written >= limit - 4096:
        found = (errno.EFBIG, None)
    if found is None:
        return None
    number, name = found
    if number in _DISK_FULL_ERRNOS:
        folder = Path(name).parent if name else Path(where)
        return disk_full_error(folder, needed if name is None else None, cleaned, number)
    return write_refused(OSError(number, os.strerror(number), name or str(where)))


def refused_write(error: BaseException | None) -> OSError | None:
    """:func:`write_failure` for a refusal only (read-only, no permission, ...) or a special
    file read as a file; None for anything else (a full disk included)."""
    failure = write_failure(error, ".")
    return None if isinstance(failure, DiskFullError) else failure
