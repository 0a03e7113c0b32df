"""Following an HDF5 file's links to other files: external links, virtual datasets'
sources and external raw storage."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5.layout import open_hdf5
from cbop_torchrl.io import atomic_write, cache_dir, config_hash, remove_stale_temporaries


def linked_files(path: Path) -> list[tuple[str, Path]]:
    """Every other file whose bytes the HDF5 file ``path`` reads: ``(key, file)`` pairs.

    External links (``handle[key] = h5py.ExternalLink(file, object)``), virtual datasets'
    source files and external raw storage (``create_dataset(..., external=...)``), found
    from the file's link table without opening a linked object. A relative name is
    looked up as HDF5 does: under ``$HDF5_EXT_PREFIX``, beside ``path``, then in the
    working directory.

    Raises:
        DatasetError: a linked file is missing, naming the key and the file.
    """
    where = f"D4RL-format file {str(path)!r}"
    files = []
    for key, name in _link_names(path):
        if name == ".":  # a virtual dataset's source in the same file
            continue
        target = _find_linked(path, name)
        if target is None:
            raise DatasetError(
                f"{where}: {key} is stored in (linked to) the file {name!r}, which does not "
                f"exist (looked for it beside {str(path)!r} and in the working directory); "
                "put that file there or write the array into this file."
            )
        files.append((key, target))
    return files


def _link_names(path: Path) -> list[tuple[str, str]]:
    """``(key, file name as stored)`` of every link in ``path`` to another file, memoized on
    disk per (path, size, mtime) like :func:`file_sha256`, so that a file is opened with
    h5py once: its links cannot change without its bytes changing."""
    stat = path.stat()
    key = config_hash(["links", str(path.resolve()), stat.st_size, stat.st_mtime_ns], length=24)
    memo = cache_dir("datasets", "_sha256") / f"{key}.links.json"  # beside the hashes
    try:
        stored = json.loads(memo.read_text())
        if isinstance(stored, list) and all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            for pair in stored
        ):
            return [(pair[0], pair[1]) for pair in stored]
    except (OSError, ValueError):
        pass
    found: list[tuple[str, str]] = []
    with open_hdf5(path) as handle:

        def visit(name: str, link: object) -> None:
            if isinstance(link, h5py.ExternalLink):
                found.append((name, link.filename))
            elif isinstance(link, h5py.HardLink):
                value = handle.get(name)
                if isinstance(value, h5py.Dataset):
                    if value.is_virtual:
                        found.extend((name, s.file_name) for s in value.virtual_sources())
                    for entry in value.external or ():
                        found.append((name, entry[0].decode() if isinstance(entry[0], bytes)
                                      else str(entry[0])))  # fmt: skip

        handle.visititems_links(visit)
    remove_stale_temporaries(memo.parent)
    atomic_write(memo, lambda tmp: tmp.write_text(json.dumps([list(pair) for pair in found])))
    return found


def _find_linked(path: Path, name: str) -> Path | None:
    candidate = Path(name)
    if candidate.is_absolute():
        places = [candidate]
    else:
        prefix = os.environ.get("HDF5_EXT_PREFIX")
        places = [Path(p) / candidate for p in (prefix.split(":") if prefix else [])]
        places += [path.parent / candidate, Path.cwd() / candidate]
    return next((place.resolve() for place in places if place.is_file()), None)
