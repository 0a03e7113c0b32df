"""Small helpers shared by every stage: cache location, atomic writes, seeding, devices."""

from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode


def cache_root() -> Path:
    """Root of the project's caches (``$CBOP_TORCHRL_CACHE`` or ``~/.cache/cbop_torchrl``)."""
    return Path(os.environ.get("CBOP_TORCHRL_CACHE", Path.home() / ".cache" / "cbop_torchrl"))


def cache_dir(*parts: str) -> Path:
    """A directory under :func:`cache_root`, created on demand."""
    return make_dirs(cache_root().joinpath(*parts))


_running_program: str | None = None


def set_running_program(name: str | None) -> None:
    """Records which of the package's programs this process runs (``cbop-train``, ...).

    Set by :func:`cbop_torchrl.apps.launch` for the console scripts, ``scripts/*.py`` and
    ``python -m cbop_torchrl <command>``; error messages then suggest that program.
    """
    global _running_program
    _running_program = name


def running_program() -> str | None:
    """The program recorded by :func:`set_running_program`; None from Python (API, notebooks)."""
    return _running_program


def program_command(name: str) -> str:
    """How to start the package's program ``name`` (``cbop-collect``) from the user's shell.

    Error messages suggest commands built on it, and a suggestion must work as
    written for a ``pip install`` of the wheel and a checkout set up with
    ``setup.sh`` (an editable install) alike: both put the console script next
    to this Python interpreter. Returns the bare name when the shell finds that
    very script on ``PATH`` (an activated venv), else the script's full path,
    else (the package imported without being installed)
    ``<python> -m cbop_torchrl <name>``.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        found = shutil.which(name)
        if found is not None and Path(found).resolve() == beside.resolve():
            return name
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m cbop_torchrl {name}"


def unwritable_reason(path: str | Path) -> str | None:
    """Why the directory ``path`` cannot be created or written into; None when it can.

    Looks at the nearest part of ``path`` that exists (nothing is created): it
    must be a directory this process may write to (``os.access``, so a root
    user's writes into a read-only-mode directory count as allowed, as they
    are; a read-only file system does not).
    """
    path = Path(path).expanduser().absolute()
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                return f"{str(existing)!r} is a file, not a directory"
            if not os.access(existing, os.W_OK | os.X_OK):
                return f"{str(existing)!r} is not writable by this user"
            return None
    return f"no part of {str(path)!r} exists"


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
    lock is held (:func:`remove_stale_temporaries`).
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


# ------------------------------------------------------------------ temporaries, disk space

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


class DiskFullError(OSError):
    """A write did not fit on its file system; the message names the place and what to do.

    An :class:`OSError` with ``errno.ENOSPC``; whatever was being written was removed.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.args[1])


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_RESERVE_BYTES = 16 << 20  # left free besides what a write needs (logs, other files)


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
    margin = f"{_RESERVE_BYTES >> 20} MB"
    size = (
        f"the write needs about {_megabytes(needed)} plus a {margin} margin that is kept free, and "
        if needed is not None
        else f"a {margin} margin is kept free beside every write, and "
    )
    if _is_within(where, cache_root()):
        hint = (
            "; the cache may also move to a larger disk (CBOP_TORCHRL_CACHE=<folder>), and "
            "clearing it is safe"
        )
    else:
        key = _output_setting or "the output setting"
        hint = f", or write to another disk ({key}=<a folder there>)"
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


def is_within(path: str | Path, root: str | Path) -> bool:
    """Whether ``path`` (links resolved) lies in the folder ``root`` (or is it)."""
    return _is_within(Path(path), Path(root))


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return True


def _nearly_full(directory: Path) -> bool:
    try:
        return shutil.disk_usage(directory).free < _RESERVE_BYTES
    except OSError:
        return False


def check_free_space(directory: str | Path, needed: int) -> None:
    """Raises :class:`DiskFullError` when ``directory``'s file system lacks ``needed`` bytes
    (plus a small reserve), before anything is written; unknown free space passes."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < needed + _RESERVE_BYTES:
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


def config_hash(config: Any, length: int = 12) -> str:
    """A stable short hash of a JSON-serializable config, used as a cache key."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Calls ``write(tmp_path)`` and renames the result onto ``path``.

    A reader sees either the old file or the complete new one, never a partial
    write, even if the process is killed in between (its temporary,
    ``.<name>.<random>.tmp``, is removed by :func:`remove_stale_temporaries`
    later). Never through a link: a folder on the way from a write root (the cache, a
    claimed run directory) to ``path`` that is a link is refused (:func:`check_no_link`)
    before anything is created, and a link at ``path`` itself is replaced, not followed.
    A full disk raises :class:`DiskFullError` with the temporary removed; any other write
    the operating system refuses (a read-only file system, no permission, ...) raises
    :class:`WriteRefusedError` naming the file and the cause.
    """
    path = Path(path)
    make_dirs(path.parent)
    scope = _owning_scope(path)
    if scope is not None:
        check_owned_output(path, scope.program)
    try:
        tmp_path, fd = make_temporary(path.parent, path.name)
    except OSError as error:
        if is_disk_full(error):
            raise disk_full_error(path.parent) from None
        raise write_refused(error, path) from None
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
            _deferred.append((tmp_path, path, fd, scope))
            return path
        os.replace(tmp_path, path)
    except Exception as error:
        tmp_path.unlink(missing_ok=True)
        os.close(fd)
        # torch.save reports a full disk as a RuntimeError ("file write failed"): a failed
        # write on a file system that is now nearly full is taken for one.
        full = is_disk_full(error) or _nearly_full(path.parent)
        if full and not isinstance(error, DiskFullError):
            raise disk_full_error(path.parent) from None
        if isinstance(error, OSError) and not isinstance(error, (DiskFullError, WriteRefusedError)):
            raise write_refused(error, path) from None
        raise
    tmp_path.unlink(missing_ok=True)
    os.close(fd)
    if scope is not None:
        _record_output(path, scope.program)
    return path


_deferred: list[tuple[Path, Path, int, Any]] | None = None


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
                raise write_refused(error, path) from None
    finally:
        for tmp_path, _, fd, _ in batch:
            tmp_path.unlink(missing_ok=True)
            os.close(fd)
    for _, path, _, scope in batch:
        if scope is not None:
            _record_output(path, scope.program)


# ----------------------------------------------------------------- links and refused writes

_write_roots: list[Path] = []


def _lexical(path: str | Path) -> Path:
    """``path`` absolute, without resolving links (so that a link on the way stays visible)."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def add_write_root(directory: str | Path) -> None:
    """Registers a folder the package owns (a run directory once claimed): below it, no
    folder on the way to a written file may be a link (:func:`check_no_link`)."""
    root = _lexical(directory)
    if root not in _write_roots:
        _write_roots.append(root)


def linked_part(path: str | Path, include_self: bool = False) -> Path | None:
    """The first folder between ``path``'s write root (the cache root, a claimed run
    directory: the deepest that holds it) and ``path`` itself that is a link; None when
    there is none or no root holds ``path``. The root itself may be a link (a cache moved
    to another disk); ``path`` itself is looked at only with ``include_self``."""
    path = _lexical(path)
    roots = [r for r in (*_write_roots, _lexical(cache_root())) if r in (path, *path.parents)]
    if not roots:
        return None
    root = max(roots, key=lambda r: len(r.parts))
    if root == path:
        return None
    for part in path.parts[len(root.parts) : None if include_self else -1]:
        root = root / part
        if root.is_symlink():
            return root
    return None


def check_no_link(path: str | Path, include_self: bool = False) -> None:
    """Refuses (:class:`ForeignFileError`) a write to ``path`` through a linked folder below
    its write root (:func:`linked_part`)."""
    linked = linked_part(path, include_self)
    if linked is not None:
        raise ForeignFileError(
            f"{str(linked)!r} is a link (to {os.readlink(linked)!r}), and cbop-torchrl never "
            f"writes through a link: writing {str(path)!r} would put a file into the link's "
            "target. Nothing was written there. Remove the link (its target is not needed), "
            "then run the same command again."
        )


def make_dirs(directory: str | Path) -> Path:
    """``directory`` created with its parents (``mkdir -p``), never through a link below its
    write root (:func:`check_no_link`); a refusal of the OS is a :class:`WriteRefusedError`."""
    directory = Path(directory)
    check_no_link(directory, include_self=True)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise write_refused(
            OSError(errno.ENOTDIR, "it exists and is not a folder", str(directory)), directory
        ) from None
    except OSError as error:
        if is_disk_full(error):
            raise disk_full_error(directory) from None
        raise write_refused(error, directory) from None
    return directory


class WriteRefusedError(OSError):
    """The operating system refused a write (a read-only file system, no permission, a path
    too long, ...); the message names the file, the cause and what to do. Every entry point
    turns it (and any refused write, :func:`refused_write`) into one paragraph, exit 2."""

    def __str__(self) -> str:
        return str(self.args[1])


_WRITE_REFUSALS = {
    errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.ELOOP,
    errno.ENAMETOOLONG, errno.EFBIG, errno.EMLINK, errno.ETXTBSY, errno.EEXIST, errno.EIO,
    errno.ENXIO, errno.ENODEV,
}  # fmt: skip

_output_setting: str | None = None


def set_output_setting(key: str | None) -> None:
    """The setting that chooses where the running program writes (``hydra.run.dir``,
    ``out``, ``json``, ...), which its messages about refused writes suggest."""
    global _output_setting
    _output_setting = key


def _write_hint(where: Path) -> str:
    if _is_within(where, cache_root()):
        return (
            "point the cache at a folder you can write to (CBOP_TORCHRL_CACHE=<folder>; "
            "clearing or moving the cache is safe)"
        )
    key = _output_setting or "the output setting"
    return f"make it writable, or write somewhere else ({key}=<a writable folder or file>)"


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


# ------------------------------------------------------------------------ owned outputs

OUTPUTS_MANIFEST = ".cbop-outputs.json"
"""The file in a user-chosen output folder that names the files the package's programs
wrote there (:func:`owned_outputs`); only those are ever replaced."""

_MANIFEST_FORMAT = "cbop-torchrl-outputs/1"


class ForeignFileError(Exception):
    """A program would replace a file it did not write (or write through a link).

    Every entry point refuses it with its message and exit code 2
    (:func:`cbop_torchrl.cli.hydra_entry`).
    """


@dataclass(frozen=True)
class _Scope:
    target: Path  # a folder (every file directly in it) or one file
    program: str


_scopes: list[_Scope] = []


@contextlib.contextmanager
def owned_outputs(target: str | Path, program: str) -> Iterator[None]:
    """While active, every :func:`atomic_write` into ``target`` (a folder, or one output file)
    replaces only files ``program`` wrote there, and records what it writes.

    Which files a program wrote is kept in the folder's :data:`OUTPUTS_MANIFEST`, and only
    there: a file is never taken for a program's own by what it holds.
    """
    scope = _Scope(_absolute(Path(target)), program)
    _scopes.append(scope)
    try:
        yield
    finally:
        _scopes.remove(scope)


def _absolute(path: Path) -> Path:
    path = path.expanduser().absolute()
    return path.parent.resolve() / path.name


def _owning_scope(path: Path) -> _Scope | None:
    if not _scopes or path.name == OUTPUTS_MANIFEST:
        return None
    path = _absolute(path)
    for scope in reversed(_scopes):
        if path == scope.target or path.parent == scope.target.resolve():
            return scope
    return None


def read_regular_bytes(path: str | Path) -> bytes:
    """The bytes of the regular file ``path``, never blocking on a special file.

    Every file a program reads after finding it by walking a folder (or by its name in a
    run directory) goes through here: it is opened with ``O_NONBLOCK`` (so a FIFO named
    ``results.json`` cannot make the program wait forever for a writer) and read only when
    ``fstat`` says it is a regular file; a FIFO, socket, device or folder is refused.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (``EINVAL``, naming what
            it is).
    """
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SpecialFileError(
                errno.EINVAL, f"it is {special_file_kind(mode)}, not a file", str(path)
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read()
    finally:
        os.close(fd)


class SpecialFileError(OSError):
    """A program was to read a FIFO, socket, device or folder as a file
    (:func:`read_regular_bytes`); every entry point refuses it with one paragraph."""

    def __str__(self) -> str:
        return (
            f"{str(self.filename)!r} is not a regular file ({self.strerror}); a program reads "
            "only files, never a FIFO (which would wait forever for a writer), socket or "
            "device. Replace it with the file it stands for, or move it out of the folders "
            "given, and run the same command again."
        )


def read_regular_text(path: str | Path) -> str:
    """:func:`read_regular_bytes` decoded as UTF-8."""
    return read_regular_bytes(path).decode()


def special_file_kind(mode: int) -> str:
    """``a FIFO (named pipe)``, ``a socket``, ``a device``, ``a folder``... for ``st_mode``."""
    import stat

    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a link"),
    ):  # fmt: skip
        if test(mode):
            return name
    return "a special file"


def is_regular_file(path: str | Path) -> bool:
    """Whether ``path`` (a link followed) is a regular file; never opens it."""
    import stat

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_regular_json(path: Path) -> tuple[Any, str | None]:
    """``(value, None)`` for a regular file holding JSON, else ``(None, what is wrong)``:
    a link or no regular file is never read, unreadable JSON is named with its error."""
    if path.is_symlink() or not path.is_file():
        return None, "is a link or not a regular file"
    try:
        return json.loads(read_regular_text(path)), None
    except (OSError, ValueError) as error:
        return None, f"cannot be read as JSON ({type(error).__name__}: {error})"


def _read_manifest(directory: Path) -> dict[str, str]:
    """``{file name: program}`` of ``directory``'s :data:`OUTPUTS_MANIFEST` ({} when none).

    Raises:
        ForeignFileError: the manifest is a link, not a regular file, or not ours.
    """
    path = directory / OUTPUTS_MANIFEST
    if not os.path.lexists(path):
        return {}
    data, problem = read_regular_json(path)
    if problem is None and not (
        isinstance(data, dict)
        and data.get("format") == _MANIFEST_FORMAT
        and isinstance(data.get("files"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in data["files"].items())
    ):
        problem = f"is not a record of cbop-torchrl's outputs (format {_MANIFEST_FORMAT!r})"
    if problem is not None:
        raise ForeignFileError(
            f"{str(path)!r} {problem}, so it is not known which files of {str(directory)!r} "
            "cbop-torchrl wrote; nothing was written there. Choose another output folder, "
            f"or remove {OUTPUTS_MANIFEST} if you made it."
        )
    return dict(data["files"])


def check_owned_output(path: str | Path, program: str) -> None:
    """Refuses (:class:`ForeignFileError`) to let ``program`` replace ``path`` unless it is
    absent or a regular file a program of this package wrote there.

    Written by one: named in its folder's :data:`OUTPUTS_MANIFEST` (the marker alone decides;
    what a file holds never makes it ours). A link is never replaced or written through,
    nor is a directory or any other special file.
    """
    path = Path(path)
    setting = f" ({program})" if program else ""
    if not os.path.lexists(path):
        _read_manifest(path.parent)  # a planted manifest is refused before anything is written
        return
    if path.is_symlink() or not path.is_file():
        what = "a link" if path.is_symlink() else "not a regular file"
        raise ForeignFileError(
            f"{str(path)!r} is {what}; this program{setting} never writes through a link or "
            "replaces a folder. Nothing was written: choose another output path."
        )
    owned = _read_manifest(path.parent)
    if path.name in owned:
        return
    raise ForeignFileError(
        f"{str(path)!r} already exists and was not written by cbop-torchrl (it is not named in "
        f"{str(path.parent / OUTPUTS_MANIFEST)!r}), so this program{setting} will not replace "
        "it; nothing was written. Choose another output path (or folder), or move that file "
        "away if it may be replaced."
    )


def _record_output(path: Path, program: str) -> None:
    """Adds ``path``'s name to its folder's :data:`OUTPUTS_MANIFEST` (written atomically)."""
    directory = path.parent
    owned = _read_manifest(directory)
    if owned.get(path.name) == program:
        return
    owned[path.name] = program
    _write_manifest(directory, owned)


def _write_manifest(directory: Path, owned: dict[str, str]) -> None:
    manifest = {"format": _MANIFEST_FORMAT, "files": dict(sorted(owned.items()))}
    atomic_write(
        directory / OUTPUTS_MANIFEST,
        lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"),
    )


def remove_stale_outputs(
    directory: str | Path, program: str, keep: Iterable[str | Path]
) -> list[Path]:
    """Removes the files ``program`` wrote in ``directory`` (its :data:`OUTPUTS_MANIFEST`) that
    are not in ``keep``, and returns them: what a program no longer writes (a figure of a
    variant that was renamed) does not linger beside what it wrote this time. Files other
    programs wrote, or nobody recorded, are left alone.
    """
    directory = Path(directory)
    kept = {Path(path).name for path in keep}
    owned = _read_manifest(directory)
    stale = [name for name, by in owned.items() if by == program and name not in kept]
    removed = []
    for name in stale:
        path = directory / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
        del owned[name]
    if stale:
        _write_manifest(directory, owned)
    return removed


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` through :func:`atomic_write`, after checking the free space for its tensors.

    Load with ``weights_only=True``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path.parent, tensor_bytes(obj))
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def file_kind(path: str | Path) -> str | None:
    """What ``path`` holds when it is no PyTorch file: ``an HDF5 file``, ``a JSON file``,
    ``a CSV file``, ``a text file``, ``an empty file``, ``a FIFO (named pipe)``...; None for
    a PyTorch file (a ZIP archive or a pickle) or one that cannot be read. Never blocks."""
    import stat

    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            return special_file_kind(mode)
        with open(path, "rb") as handle:
            head = handle.read(65536)
    except OSError:
        return None
    if not head:
        return "an empty file"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file"
    if head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's ZIP archive, or a pickle
        return None
    try:
        text = head.decode()
    except UnicodeDecodeError:
        return "a binary file of another format"
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            json.loads(Path(path).read_text())
            return "a JSON file"
        except (OSError, ValueError):
            return "a text file (it starts like JSON)"
    lines = [line for line in stripped.splitlines()[:20] if line]
    if len(lines) > 1 and len({line.count(",") for line in lines}) == 1 and "," in lines[0]:
        return "a CSV file"
    return "a text file"


def describe_load_error(error: BaseException, path: str | Path | None = None) -> str:
    """A one-line reason why ``torch.load(..., weights_only=True)`` failed.

    PyTorch's own message for a file holding other objects than tensors and
    plain containers suggests ``weights_only=False``, which would run the
    file's pickled code; this project never loads that way, so that advice is
    replaced by what the failure means. With ``path``, a file that is not a PyTorch file
    at all is named for what it is (:func:`file_kind`: JSON, CSV, HDF5, text).
    """
    kind = file_kind(path) if path is not None else None
    if kind is not None:
        return f"it is {kind}, not a file written by torch.save"
    text = str(error)
    if "weights_only" in text or "Weights only load failed" in text:
        return (
            "it holds objects other than tensors and plain containers, which "
            "torch.load(weights_only=True) refuses to unpickle"
        )
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__


def atomic_json_dump(obj: Any, path: str | Path) -> Path:
    """Writes ``obj`` as indented JSON through :func:`atomic_write`."""

    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")

    return atomic_write(path, write)


def keep_mujoco_log_out_of_cwd() -> None:
    """MuJoCo writes its warnings (a deprecated model attribute, an unstable simulation) to
    ``MUJOCO_LOG.TXT`` in the working directory as well as to the console; no program of
    this package writes into the working directory unless told to, so the file copy is
    turned off (the console still shows them). Does nothing without MuJoCo."""
    import importlib.util

    if importlib.util.find_spec("mujoco") is None:
        return
    try:
        import mujoco

        config = mujoco.MjLogConfig.get()
        config.logto_file = False
        config.set()
    except Exception:  # another MuJoCo version without MjLogConfig: its default stays
        return


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else CPU; ``"cuda"`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise RuntimeError(
            f"device={device!r} is not a device; use auto, cpu, cuda or cuda:<index>."
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} was requested but no CUDA device is available; "
            "use device=cpu or device=auto."
        )
    return resolved


class HostSyncCounter(TorchDispatchMode):
    """Counts the operations that make the host wait for the device, while active.

    Counted: ``aten._local_scalar_dense`` (``.item()``, ``bool()``/``float()``/
    ``int()`` of a tensor, ``if tensor:``), copies from a non-CPU device to the
    CPU (``.cpu()``, ``.tolist()``, ``.to("cpu")``) and ops whose output shape
    depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``).
    On a CPU-only machine nothing waits, but the same Python code makes the
    same calls, so counting them on CPU tells how often a GPU run would stall.

    Example::

        with HostSyncCounter() as counter:
            update(batch)
        counter.count, counter.by_op  # total and {op name: count}
    """

    _DATA_DEPENDENT = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique")

    def __init__(self) -> None:
        super().__init__()
        self.by_op: dict[str, int] = {}

    @property
    def count(self) -> int:
        return sum(self.by_op.values())

    def _add(self, name: str) -> None:
        self.by_op[name] = self.by_op.get(name, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func.name()
        if name == "aten::_local_scalar_dense" or name.startswith(self._DATA_DEPENDENT):
            self._add(name)
        elif name in ("aten::_to_copy", "aten::copy_") and args:
            source = args[1] if name == "aten::copy_" else args[0]
            target = args[0].device if name == "aten::copy_" else kwargs.get("device")
            if (
                isinstance(source, torch.Tensor)
                and source.device.type != "cpu"
                and target is not None
                and torch.device(target).type == "cpu"
            ):
                self._add(f"{name} (device to host)")
        elif name == "aten::index.Tensor" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())
        ):
            self._add("aten::index.Tensor (boolean mask)")
        return func(*args, **kwargs)


# Command-line overrides for the commands messages suggest (cli.py and envs/task.py use them;
# here, at the bottom of the stack, so that any layer may).


def override_value(text: str) -> str:
    """``text`` as a Hydra override value that Hydra reads back as exactly this string:
    bare when it is a plain word Hydra takes for a string, else single-quoted (a quote
    escaped, and the backslashes before a quote or the closing one doubled; ``${``
    escaped so that it is no interpolation)."""
    if re.fullmatch(r"[\w./~:+@%-]+", text) and not _other_type(text):
        return text
    quoted = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text)
    quoted = quoted.replace("'", "\\'").replace("${", "\\${")
    return f"'{quoted}'"


def _other_type(text: str) -> bool:
    """Whether Hydra reads the bare word ``text`` as something other than that string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(f"k={text}").value() != text
    except Exception:
        return True


def override_word(key: str, value: Any) -> str:
    """``key=value`` as a command-line override that sets exactly ``value`` (a string,
    number, bool, None or a list of them), for the commands messages suggest."""
    return f"{key}={_override_literal(value)}"


def _override_literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_literal(item) for item in value) + "]"
    if isinstance(value, enum.Enum):
        value = value.value
    return override_value(str(value))
