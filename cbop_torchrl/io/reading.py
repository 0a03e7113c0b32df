"""Reading files found by walking a folder: regular files only, never blocking, and what a
file that is not the expected one holds."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from cbop_torchrl.io.failures import SpecialFileError


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


def read_regular_text(path: str | Path) -> str:
    """:func:`read_regular_bytes` decoded as UTF-8."""
    return read_regular_bytes(path).decode()


def read_regular_json(path: Path) -> tuple[Any, str | None]:
    """``(value, None)`` for a regular file holding JSON, else ``(None, what is wrong)``:
    a link or no regular file is never read, unreadable JSON is named with its error."""
    if path.is_symlink() or not path.is_file():
        return None, "is a link or not a regular file"
    try:
        return json.loads(read_regular_text(path)), None
    except (OSError, ValueError) as error:
        return None, f"cannot be read as JSON ({type(error).__name__}: {error})"


def read_json(path: str | Path, error: type[Exception], hint: str | None = None) -> Any:
    """The JSON value in the regular file ``path`` (read by :func:`read_regular_text`).

    Raises:
        error: ``path`` cannot be read or parsed (truncated, damaged, a special file); the
            message names the file and the failure, then ``hint`` (what to do), if given.
    """
    try:
        return json.loads(read_regular_text(path))
    except (OSError, ValueError) as failure:
        reason = f"cannot read {str(path)!r} ({type(failure).__name__}: {failure})"
        raise error(f"{reason}; {hint}" if hint else reason) from None


def read_json_object(
    path: str | Path, error: type[Exception], hint: str | None = None
) -> dict[str, Any]:
    """The JSON object in the regular file ``path``.

    Raises:
        error: ``path`` cannot be read or parsed (:func:`read_json`, with ``hint``), or it
            holds another JSON value than an object.
    """
    value = read_json(path, error, hint)
    if not isinstance(value, dict):
        raise error(f"{str(path)!r} holds a {type(value).__name__}, not a JSON object")
    return value


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


def require_regular_file(
    path: Path, error: type[Exception], what: str, hint: str, missing: str
) -> None:
    """Raises ``error`` unless ``path`` is a regular file (never opens anything else).

    The message is ``'<path>' is <its kind>, not <what>; <hint>`` for a folder, a FIFO or a
    device, and ``missing`` when nothing is there.
    """
    if path.is_file():
        return
    if path.exists():  # a folder, a FIFO (never opened: it would block), a device
        raise error(f"{str(path)!r} is {file_kind(path)}, not {what}; {hint}")
    raise error(missing)


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
