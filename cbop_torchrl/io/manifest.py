"""The output manifest: which files of a user's folder the package's programs wrote.

A program that writes into a folder the user chose (a report, an evaluation, a generated
dataset) replaces only files a program of this package wrote there, as named in the
folder's :data:`OUTPUTS_MANIFEST`, and records there what it writes
(:func:`owned_outputs`). What a file holds never makes it the package's.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cbop_torchrl.io.atomic import atomic_write, guarded_writes
from cbop_torchrl.io.failures import ForeignFileError
from cbop_torchrl.io.reading import read_regular_json

OUTPUTS_MANIFEST = ".cbop-outputs.json"
"""The file in a user-chosen output folder that names the files the package's programs
wrote there (:func:`owned_outputs`); only those are ever replaced."""

_MANIFEST_FORMAT = "cbop-torchrl-outputs/1"


def _absolute(path: Path) -> Path:
    path = path.expanduser().absolute()
    return path.parent.resolve() / path.name


@dataclass(frozen=True)
class _Scope:
    """The guard :func:`owned_outputs` puts on :func:`~cbop_torchrl.io.atomic_write`."""

    target: Path  # a folder (every file directly in it) or one file
    program: str

    def covers(self, path: Path) -> bool:
        if path.name == OUTPUTS_MANIFEST:
            return False
        path = _absolute(path)
        return path == self.target or path.parent == self.target.resolve()

    def check(self, path: Path) -> None:
        check_owned_output(path, self.program)

    def record(self, path: Path) -> None:
        _record_output(path, self.program)


@contextlib.contextmanager
def owned_outputs(target: str | Path, program: str) -> Iterator[None]:
    """While active, every :func:`~cbop_torchrl.io.atomic_write` into ``target`` (a folder,
    or one output file) replaces only files ``program`` wrote there, and records what it
    writes.

    Which files a program wrote is kept in the folder's :data:`OUTPUTS_MANIFEST`, and only
    there: a file is never taken for a program's own by what it holds.
    """
    with guarded_writes(_Scope(_absolute(Path(target)), program)):
        yield


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
    """Refuses (:class:`~cbop_torchrl.io.ForeignFileError`) to let ``program`` replace
    ``path`` unless it is absent or a regular file a program of this package wrote there.

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
