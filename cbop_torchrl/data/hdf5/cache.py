"""The cache of converted files: raw leaves and a manifest, written all or nothing.

The cache is an input like the file itself, so it is stored and read without
pickle or any class named in its metadata: one raw ``.bin`` file per tensor and a
``leaves.json`` manifest (key, dtype from a fixed list of numeric ones, shape),
each file's size checked against its manifest entry before it is read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.io import (
    atomic_json_dump,
    cache_dir,
    check_free_space,
    make_temporary,
    remove_stale_temporaries,
    write_failure,
)

FORMAT_VERSION = 3
"""Bump when the conversion changes so old caches are not reused (3: raw leaves, no memmap)."""

#: The only dtypes a cache entry may hold (manifest name -> numpy dtype).
_LEAF_DTYPES = {"float32": np.float32, "bool": np.bool_, "int64": np.int64}
_LEAF_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def cache_entry(fingerprint: str) -> Path:
    return cache_dir("datasets") / fingerprint


def cached_info(fingerprint: str) -> dict | None:
    """The stored summary of a converted file, or None when it was never converted."""
    info_path = cache_entry(fingerprint) / "info.json"
    if not info_path.exists():
        return None
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as error:
        info, why = None, f"{type(error).__name__}: {error}"
    else:
        why = "not a summary of a converted file"
    if not isinstance(info, dict) or "fingerprint" not in info:
        raise DatasetError(
            f"the dataset cache entry {str(info_path.parent)!r} is damaged or was not written "
            f"by cbop-torchrl (its info.json: {why}); delete that directory and run the "
            "command again to convert the file afresh."
        )
    return info


def _write_cache_data(data: TensorDict, directory: Path) -> None:
    """Writes every leaf of ``data`` (batch ``[N]``) as raw bytes plus ``leaves.json``.

    One leaf at a time; nothing in the files names a class or needs pickle to read.
    """
    directory.mkdir()
    manifest = []
    for key in data.keys(include_nested=True, leaves_only=True):
        parts = [key] if isinstance(key, str) else list(key)
        tensor = data.get(key).contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in _LEAF_DTYPES or not all(_LEAF_KEY.match(part) for part in parts):
            raise ValueError(f"cannot cache the leaf {parts} of dtype {dtype}")
        tensor.numpy().tofile(directory / f"{'.'.join(parts)}.bin")
        manifest.append({"key": parts, "dtype": dtype, "shape": list(tensor.shape)})
    atomic_json_dump({"batch_size": list(data.batch_size), "leaves": manifest},
                     directory / "leaves.json")  # fmt: skip


def read_cached_data(path: Path) -> TensorDict:
    """The dataset stored at ``path`` by :func:`_write_cache_data`, as an in-memory TensorDict.

    Every manifest entry is checked (key names, a dtype of :data:`_LEAF_DTYPES`, a
    shape whose byte size is the file's) before its file is read with
    ``numpy.fromfile``, which reads numbers only.

    Raises:
        DatasetError: the entry is not what this package writes (edited or damaged).
    """

    def damaged(why: str) -> DatasetError:
        return DatasetError(
            f"the dataset cache entry {str(path.parent)!r} is damaged or was not written by "
            f"cbop-torchrl ({why}); delete that directory and run the command again to "
            "convert the file afresh."
        )

    try:
        manifest = json.loads((path / "leaves.json").read_text())
        batch_size = [int(size) for size in manifest["batch_size"]]
        leaves = list(manifest["leaves"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise damaged(f"unreadable leaves.json: {error}") from None
    data = TensorDict(batch_size=batch_size)
    for leaf in leaves:
        try:
            parts, dtype, shape = list(leaf["key"]), leaf["dtype"], [int(n) for n in leaf["shape"]]
        except (KeyError, TypeError, ValueError):
            raise damaged(f"a bad manifest entry {leaf!r}") from None
        if not parts or not all(isinstance(p, str) and _LEAF_KEY.match(p) for p in parts):
            raise damaged(f"a bad leaf name {parts!r}")
        if dtype not in _LEAF_DTYPES:
            raise damaged(f"leaf {parts} has dtype {dtype!r}, not one of {sorted(_LEAF_DTYPES)}")
        if shape[: len(batch_size)] != batch_size or any(n < 0 for n in shape):
            raise damaged(f"leaf {parts} has shape {shape}, batch {batch_size}")
        file = path / f"{'.'.join(parts)}.bin"
        numpy_dtype = np.dtype(_LEAF_DTYPES[dtype])
        expected = int(np.prod(shape, dtype=np.int64)) * numpy_dtype.itemsize
        if file.is_symlink() or not file.is_file() or file.stat().st_size != expected:
            raise damaged(f"{file.name} is missing or not {expected} bytes")
        values = np.fromfile(file, dtype=numpy_dtype).reshape(shape)
        data.set(tuple(parts), torch.from_numpy(values))
    return data


_OLD_STAGING = re.compile(r"^\.[^/]+-[0-9a-f]{12}\.[a-z0-9_]{8}$")
_OLD_STAGING_AGE_S = 24 * 3600


def _remove_old_staging(directory: Path) -> None:
    """Removes staging directories that versions before ``.tmp`` names leaked (a killed or
    disk-full conversion): ``.<stem>-<12 hex digits>.<8 characters>``, a day old or more.

    Those versions held no lock on them, so age is what tells that no conversion still
    writes there (one takes minutes at most).
    """
    now = time.time()
    for entry in directory.iterdir():
        if _OLD_STAGING.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            if now - entry.lstat().st_mtime >= _OLD_STAGING_AGE_S:
                shutil.rmtree(entry, ignore_errors=True)


def store_cache_entry(data: TensorDict, info: dict, entry: Path) -> None:
    """Writes ``data`` and ``info`` as the cache entry ``entry``, all or nothing.

    The entry is built in a temporary directory (:func:`~cbop_torchrl.io.make_temporary`)
    and renamed, so a killed run never leaves a half-written entry that a later run would
    trust; the free space is checked first, and a full disk raises
    :class:`~cbop_torchrl.io.DiskFullError` with the temporary directory removed.
    """
    remove_stale_temporaries(entry.parent)  # left by a killed conversion
    _remove_old_staging(entry.parent)
    needed = sum(
        tensor.numel() * tensor.element_size()
        for tensor in data.values(include_nested=True, leaves_only=True)
    )
    check_free_space(entry.parent, needed)
    staging, fd = make_temporary(entry.parent, entry.name, is_dir=True)
    try:
        _write_cache_data(data, staging / "data")
        atomic_json_dump(info, staging / "info.json")
        try:
            os.replace(staging, entry)
        except OSError:  # another process finished the same entry first
            if cached_info(entry.name) is None:
                raise
    except OSError as error:
        if (failure := write_failure(error, entry.parent, needed)) is not None:
            raise failure from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)
