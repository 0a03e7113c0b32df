"""D4RL's HDF5 layout: its keys, its signature, its metadata, and files written in it.

A D4RL-format file holds flat arrays ``observations [N, obs]``, ``next_observations
[N, obs]``, ``actions [N, act]``, ``rewards [N]``, ``terminals [N]``, ``timeouts [N]``
and optionally ``infos/*`` and ``metadata/*`` (D4RL's own downloads and the files
``cbop-collect`` writes with :func:`write_d4rl_hdf5`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.io import atomic_write

REQUIRED_KEYS = (
    "observations",
    "next_observations",
    "actions",
    "rewards",
    "terminals",
    "timeouts",
)

Arrays = dict[str, np.ndarray]
"""Arrays by their D4RL key (``observations``, ``infos/qpos``, ...)."""

GENERATED_INFO_KEYS = ("infos/qpos", "infos/qvel")
"""The ``infos/*`` arrays a generated file holds besides :data:`REQUIRED_KEYS`."""


def open_hdf5(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(
            f"{str(path)!r} cannot be opened as an HDF5 file ({err}); pass a D4RL-format "
            ".hdf5 file, a D4RL id, minari:<id> or demo."
        ) from None


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The 8 bytes an HDF5 file starts with, at byte 0 or, after a user block, at 512, 1024, ..."""


def check_hdf5_signature(path: Path) -> None:
    """Refuses a file that is not HDF5, reading a few bytes only (before any hashing).

    Raises:
        DatasetError: no HDF5 signature at byte 0, 512, 1024, 2048, ... of the file.
    """
    size = path.stat().st_size
    with open(path, "rb") as handle:
        offset = 0
        while offset + len(HDF5_SIGNATURE) <= size:
            handle.seek(offset)
            if handle.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                return
            offset = 512 if offset == 0 else offset * 2
    raise DatasetError(
        f"{str(path)!r} cannot be opened as an HDF5 file (its {size} bytes lack the HDF5 "
        "signature: it is another format); pass a D4RL-format .hdf5 file, a D4RL id, "
        "minari:<id> or demo."
    )


def metadata_text(handle: h5py.File, name: str) -> str | None:
    """``metadata/<name>`` as a dataset or an attribute of ``metadata`` / the file."""
    value = None
    if f"metadata/{name}" in handle and isinstance(handle[f"metadata/{name}"], h5py.Dataset):
        value = handle[f"metadata/{name}"][()]
    elif "metadata" in handle and name in handle["metadata"].attrs:
        value = handle["metadata"].attrs[name]
    elif name in handle.attrs:
        value = handle.attrs[name]
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size else None
    if isinstance(value, bytes):
        value = value.decode()
    return None if value is None else str(value)


def write_d4rl_hdf5(
    path: Path,
    arrays: Arrays,
    metadata: dict[str, Any],
    compression: str | None = "gzip",
    compression_level: int = 4,
) -> None:
    """Writes ``arrays`` and ``metadata/*`` atomically, chunked and compressed.

    Gzip with the shuffle filter shrinks MuJoCo float32 data about 2x; any
    HDF5 reader (h5py, D4RL's ``get_dataset``) decompresses transparently.
    """
    options: dict[str, Any] = {}
    if compression:
        options = {"compression": compression, "shuffle": True}
        if compression == "gzip":
            options["compression_opts"] = compression_level

    def write(tmp: Path) -> None:
        # The temporary is private and atomic_write already holds a flock on it (marking it
        # in use); HDF5's own flock would conflict with that one, so HDF5's is turned off.
        with h5py.File(tmp, "w", locking=False) as handle:
            for key, value in arrays.items():
                handle.create_dataset(key, data=value, **options)
            for key, value in metadata.items():
                if value is not None:  # e.g. no normalized score for a task without ref scores
                    handle[f"metadata/{key}"] = value

    atomic_write(path, write)


def read_d4rl_hdf5(path: Path) -> tuple[Arrays, dict[str, Any]]:
    """The arrays and ``metadata/*`` of a file written by :func:`write_d4rl_hdf5`."""
    arrays: Arrays = {}
    metadata: dict[str, Any] = {}
    with h5py.File(path, "r") as handle:
        for key in (*REQUIRED_KEYS, *GENERATED_INFO_KEYS):
            arrays[key] = handle[key][()]
        for key, value in handle["metadata"].items():
            value = value[()]
            metadata[key] = value.decode() if isinstance(value, bytes) else value
    return arrays, metadata
