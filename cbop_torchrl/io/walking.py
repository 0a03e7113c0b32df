"""Finding input files by walking a folder: regular files only, each skipped one named.

:func:`find_regular_files` is the one walker of every program that gathers its inputs
from folders (``cbop-report``, ``cbop-select-psi``, the sweep readers, the benchmark
tools): a FIFO, socket or device whose name matches is skipped with a note on stderr,
never opened (opening a FIFO waits forever for a writer).
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

from cbop_torchrl.io.reading import special_file_kind

SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")
"""Folders of the kernel's pseudo file systems: never searched (``/proc/<pid>/cwd`` links to
every process's working directory, ``/dev`` holds devices)."""


def is_system_folder(real: str) -> bool:
    """Whether the resolved path ``real`` is (inside) one of :data:`SYSTEM_FOLDERS`."""
    return any(real == top or real.startswith(f"{top}/") for top in SYSTEM_FOLDERS)


def find_regular_files(root: str | Path, pattern: str, depth: int | None = None) -> list[Path]:
    """The regular files under ``root`` whose name matches ``pattern`` (``"*.json"``), sorted.

    Symbolic links to folders are followed, so a folder of links to runs kept elsewhere is
    searched like the runs themselves; each real folder is searched once (a link back up
    the tree does not loop) and :data:`SYSTEM_FOLDERS` are never entered. ``depth``: only
    files exactly that many folders below ``root`` (1: ``root/*/<pattern>``); None: any.
    A matching name that is no regular file is skipped, with one note on stderr naming it
    and what it is. Paths are given as found under ``root`` (through the links).
    """
    found, seen = [], set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        level = len(Path(folder).relative_to(root).parts)
        if real in seen or is_system_folder(real) or (depth is not None and level > depth):
            subfolders.clear()  # reached again through a link, the kernel's, or too deep
            continue
        seen.add(real)
        subfolders.sort()
        if depth is not None and level != depth:
            continue
        for name in fnmatch.filter(files, pattern):
            path = Path(folder) / name
            if (kind := _not_regular(path)) is None:
                found.append(path)
            else:
                print(
                    f"note: skipped {str(path)!r}: it is {kind}, not a regular file, so it "
                    "was not read (a program reads only files, never a FIFO, which would "
                    "wait forever for a writer, socket or device)",
                    file=sys.stderr,
                )
    return sorted(found)


def _not_regular(path: Path) -> str | None:
    """None for a regular file (or a link to one), else what ``path`` is."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a dangling link or a file that vanished"
    return None if stat.S_ISREG(mode) else special_file_kind(mode)
