"""Folders made on the way to a written file, never through a link below a write root."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from cbop_torchrl.io.failures import (
    ForeignFileError,
    write_failure,
    write_refused,
)
from cbop_torchrl.io.roots import lexical, write_roots


def linked_part(path: str | Path, include_self: bool = False) -> Path | None:
    """The first folder between ``path``'s write root (the cache root, a claimed run
    directory: the deepest that holds it) and ``path`` itself that is a link; None when
    there is none or no root holds ``path``. The root itself may be a link (a cache moved
    to another disk); ``path`` itself is looked at only with ``include_self``."""
    path = lexical(path)
    roots = [r for r in write_roots() if r in (path, *path.parents)]
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
    write root (:func:`check_no_link`); a refusal of the OS is a
    :class:`~cbop_torchrl.io.WriteRefusedError`."""
    directory = Path(directory)
    check_no_link(directory, include_self=True)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise write_refused(
            OSError(errno.ENOTDIR, "it exists and is not a folder", str(directory)), directory
        ) from None
    except OSError as error:
        raise (write_failure(error, directory) or write_refused(error, directory)) from None
    return directory
