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
    """A write did not fit on its file system; the message names the place and what to do.

    An :class:`OSError` with ``errno.ENOSPC``; whatever was being written was removed.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

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

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RESERVE_BYTES = 16 << 20
"""Left free besides what a write needs (logs, other files)."""


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is "no space left" or "quota"."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
            return True
        if "No space left on device" in str(error):  # h5py's errors carry the text only
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def disk_full_error(
    where: str | Path, needed: int | None = None, cleaned: bool = True
) -> DiskFullError:
    """The :class:`DiskFullError` for a write into ``where`` (``needed`` bytes, if known;
    ``cleaned``: the caller removed what it had begun to write)."""
    where = Path(where)
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
    if is_within(where, cache_root()):
        hint = (
            "; the cache may also move to a larger disk (CBOP_TORCHRL_CACHE=<folder>), and "
            "clearing it is safe"
        )
    else:
        hint = f", or write to another disk ({output_setting()}=<a folder there>)"
    return DiskFullError(
        f"not enough disk space to write into {str(where)!r}: {size}its file system has "
        f"{free}.{' Nothing half-written was left there.' if cleaned else ''} Free some "
        f"space and run the same command again (a run resumes from its last checkpoint){hint}."
    )


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{max(1, round(size / 1e3))} KB"


def as_disk_full_error(error: BaseException, default_dir: str | Path) -> DiskFullError:
    """``error`` (one :func:`is_disk_full` accepts) as a :class:`DiskFullError` naming the
    folder of the file it failed on, else ``default_dir``."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    if isinstance(error, DiskFullError):
        return error
    filename = getattr(error, "filename", None)
    return disk_full_error(Path(filename).parent if filename else default_dir, cleaned=False)


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


_H5_ERRNO = re.compile(r"name = '(?P<name>[^']*)', errno = (?P<errno>\d+)")


def refused_write(error: BaseException | None) -> OSError | None:
    """The :class:`WriteRefusedError` for ``error`` (or an error it was raised from) when
    it is a write, open or creation the operating system refused, naming the file and the
    cause (or the :class:`SpecialFileError` of a special file read as a file); None
    otherwise. h5py's errors carry the file and errno in their text only."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, (WriteRefusedError, SpecialFileError)):
            return error
        if isinstance(error, OSError):
            number, name = error.errno, error.filename
            match = _H5_ERRNO.search(str(error))
            if number is None and match is not None:
                number, name = int(match["errno"]), match["name"]
            if number in _WRITE_REFUSALS and name:
                return write_refused(OSError(number, os.strerror(number), str(name)))
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None
