"""What identifies a file's data: the SHA-256 of its bytes and of the files it links to."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5.cache import FORMAT_VERSION
from cbop_torchrl.data.hdf5.layout import check_hdf5_signature
from cbop_torchrl.data.hdf5.links import linked_files
from cbop_torchrl.io import atomic_write, cache_dir, config_hash, remove_stale_temporaries


def sha256_of_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (never memoized)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, memoized on disk per (path, size, mtime)."""
    stat = path.stat()
    key = config_hash([str(path.resolve()), stat.st_size, stat.st_mtime_ns], length=24)
    memo = cache_dir("datasets", "_sha256") / f"{key}.txt"
    if memo.is_file() and re.fullmatch(r"[0-9a-f]{64}", text := memo.read_text().strip()):
        return text
    digest = sha256_of_file(path)
    remove_stale_temporaries(memo.parent)
    # written atomically: an empty memo (a kill or a full disk mid-write) would give every
    # file the same fingerprint
    atomic_write(memo, lambda tmp: tmp.write_text(digest + "\n"))
    return digest


_MAX_LINK_DEPTH = 8


def content_key(path: Path, _depth: int = 0) -> str:
    """The SHA-256 that identifies the data ``path`` holds: its own bytes (:func:`file_sha256`)
    and, when it reads other files (:func:`linked_files`), theirs, so a change to a linked
    file is a change of the data too.

    Raises:
        DatasetError: a linked file is missing, or links nest deeper than 8 files (a cycle).
    """
    own = file_sha256(path)
    links = linked_files(path)
    if not links:
        return own
    if _depth >= _MAX_LINK_DEPTH:
        raise DatasetError(
            f"{str(path)!r} links to other HDF5 files more than {_MAX_LINK_DEPTH} levels deep "
            "(a cycle of links?); write the arrays into one file."
        )
    digest = hashlib.sha256(f"{own}\n".encode())
    for key, target in sorted(links):
        try:
            check_hdf5_signature(target)
            linked = content_key(target, _depth + 1)
        except DatasetError:  # raw external storage is no HDF5 file: its bytes
            linked = file_sha256(target)
        digest.update(f"{key}={target}:{linked}\n".encode())
    return digest.hexdigest()


def hdf5_fingerprint(path: Path, content: str | None = None) -> str:
    """``<file stem>-<hash of content and conversion version>`` (``content``: the file's
    :func:`content_key`, when already known)."""
    content = content or content_key(path)
    return f"{path.stem}-{config_hash([content, FORMAT_VERSION])}"
