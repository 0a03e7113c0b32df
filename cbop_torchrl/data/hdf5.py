"""D4RL-format HDF5 files: family detection, validation, conversion and its cache.

A D4RL-format file holds flat arrays ``observations [N, obs]``, ``next_observations
[N, obs]``, ``actions [N, act]``, ``rewards [N]``, ``terminals [N]``, ``timeouts [N]``
and optionally ``infos/*`` and ``metadata/*`` (D4RL's own downloads and the files
``scripts/collect.py`` writes). The file is read with h5py, validated, turned into the
dataset TensorDict once and memory-mapped under ``cache_dir("datasets", <fingerprint>)``;
later loads read that cache and never open the HDF5 file again. The fingerprint comes
from the file's content (SHA-256, remembered per path/size/mtime so it is computed once).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import h5py
import numpy as np
import torch
from tensordict import TensorDict

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.transitions import build_transitions
from cbop_torchrl.registry import EnvFamily, families, family_from_gym_id, get_family
from cbop_torchrl.utils import atomic_json_dump, cache_dir, config_hash

FORMAT_VERSION = 1
"""Bump when the conversion changes so old caches are not reused."""

REQUIRED_KEYS = (
    "observations",
    "next_observations",
    "actions",
    "rewards",
    "terminals",
    "timeouts",
)


ENV_ID_KEYS = ("env_id", "gym_id", "env")
"""``metadata/<key>`` names read as the gymnasium id the data was recorded on."""

# ----------------------------------------------------------------------------- family


def family_from_env_id(env_id: str) -> EnvFamily:
    """The family of a gymnasium id: ``Hopper-v4`` exactly, or ``Hopper-v5`` by name.

    A version other than the registered one is accepted with a warning, because
    evaluation always happens on the registered gym id.
    """
    try:
        return family_from_gym_id(env_id)
    except KeyError:
        pass
    base = re.sub(r"-v\d+$", "", env_id.split("/")[-1]).lower()
    family = families().get(base)
    if family is None:
        raise DatasetError(
            f"the dataset was recorded on environment {env_id!r}, which matches no registered "
            f"family ({sorted(families())}); pass family=<name> to load it as one of them, "
            "or register the family with cbop_torchrl.registry.register_family."
        )
    warnings.warn(
        f"dataset recorded on {env_id!r}; it is loaded as family {family.name!r} and policies "
        f"are evaluated on {family.gym_id!r}, not on {env_id!r}.",
        stacklevel=3,
    )
    return family


def _resolve_family(family: str | EnvFamily) -> EnvFamily:
    if isinstance(family, EnvFamily):
        return family
    try:
        return get_family(family)
    except KeyError as err:
        raise DatasetError(str(err.args[0])) from None


def _metadata_text(handle: h5py.File, name: str) -> str | None:
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


def detect_family(handle: h5py.File, path: Path) -> EnvFamily:
    """Family of an open D4RL-format file, from metadata, file name, or sizes (in that order)."""
    family_name = _metadata_text(handle, "family")
    if family_name:
        return _resolve_family(family_name)
    for key in ENV_ID_KEYS:
        env_id = _metadata_text(handle, key)
        if env_id:
            return family_from_env_id(env_id)
    prefix = path.name.split("-")[0].split("_")[0].lower()
    if prefix in families():
        return families()[prefix]
    try:
        obs_dim = handle["observations"].shape[-1]
        act_dim = handle["actions"].shape[-1]
    except KeyError:
        obs_dim = act_dim = None
    matches = [f for f in families().values() if (f.obs_dim, f.action_dim) == (obs_dim, act_dim)]
    if len(matches) == 1:
        return matches[0]
    sizes = (
        f"observation/action sizes {obs_dim}/{act_dim} fit {sorted(f.name for f in matches)}"
        if obs_dim is not None
        else "it lacks observations/actions"
    )
    raise DatasetError(
        f"cannot tell which environment family {str(path)!r} belongs to: it has no "
        f"metadata/family or metadata/env_id, its name does not start with a registered "
        f"family ({sorted(families())}), and {sizes}. Pass family=<name>, e.g. "
        f"load_dataset({str(path)!r}, family='walker2d')."
    )


# ------------------------------------------------------------------------- validation


def _first_bad_row(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(-1))[0])


def _read_and_validate(handle: h5py.File, path: Path, family: EnvFamily) -> dict[str, np.ndarray]:
    """All required arrays of ``handle``, checked for keys, shapes, sizes and values."""
    where = f"D4RL-format file {str(path)!r}"
    missing = [key for key in REQUIRED_KEYS if key not in handle]
    if missing:
        raise DatasetError(
            f"{where} lacks the key(s) {missing}; a D4RL-format file needs {list(REQUIRED_KEYS)} "
            f"(it has {sorted(handle.keys())}). Write next_observations explicitly (D4RL v2 "
            "files and scripts/collect.py do) and timeouts as all-False if no episode was cut."
        )
    arrays = {key: handle[key][()] for key in REQUIRED_KEYS}

    expected_width = {
        "observations": family.obs_dim,
        "next_observations": family.obs_dim,
        "actions": family.action_dim,
    }
    for key, width in expected_width.items():
        shape = arrays[key].shape
        if len(shape) != 2 or shape[1] != width:
            raise DatasetError(
                f"{where}: {key} has shape {list(shape)} but family {family.name!r} needs "
                f"[N, {width}] (observation size {family.obs_dim}, action size "
                f"{family.action_dim}). Pass the right family=..., or check that the file "
                "was recorded on that environment."
            )
    for key in ("rewards", "terminals", "timeouts"):
        array = arrays[key]
        if array.ndim == 2 and array.shape[1] == 1:
            arrays[key] = array = array[:, 0]
        if array.ndim != 1:
            raise DatasetError(
                f"{where}: {key} has shape {list(array.shape)}, expected one value per row, [N]."
            )

    num_rows = arrays["observations"].shape[0]
    for key, array in arrays.items():
        if array.shape[0] != num_rows:
            raise DatasetError(
                f"{where}: {key} has {array.shape[0]} rows but observations has {num_rows}; "
                f"every key must have one entry per transition (first bad row: "
                f"{min(array.shape[0], num_rows)}). The file is probably truncated or was "
                "written from buffers of different lengths."
            )
    if num_rows == 0:
        raise DatasetError(f"{where} holds no transitions; it needs at least one row.")

    for key in ("observations", "next_observations", "actions", "rewards"):
        finite = np.isfinite(arrays[key])
        if not finite.all():
            row = _first_bad_row(~finite)
            raise DatasetError(
                f"{where}: {key} has a non-finite value (NaN or inf) at row {row}; every "
                "observation, action and reward must be finite. Drop or repair those rows."
            )
    for key in ("terminals", "timeouts"):
        flags = arrays[key]
        bad = ~np.isin(flags, (0, 1))
        if bad.any():
            raise DatasetError(
                f"{where}: {key} must hold booleans (0/1) but row {_first_bad_row(bad)} "
                f"is {flags[_first_bad_row(bad)]!r}."
            )
    return arrays


def _open_hdf5(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(
            f"{str(path)!r} cannot be opened as an HDF5 file ({err}); pass a D4RL-format "
            ".hdf5 file, a D4RL id, minari:<id> or demo."
        ) from None


# ---------------------------------------------------------------------- fingerprint


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, memoized on disk per (path, size, mtime)."""
    stat = path.stat()
    key = config_hash([str(path.resolve()), stat.st_size, stat.st_mtime_ns], length=24)
    memo = cache_dir("datasets", "_sha256") / f"{key}.txt"
    if memo.exists():
        return memo.read_text().strip()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    memo.write_text(digest.hexdigest() + "\n")
    return digest.hexdigest()


def hdf5_fingerprint(path: Path, family: EnvFamily) -> str:
    """``<file stem>-<hash of content, family and conversion version>``."""
    content = file_sha256(path)
    return f"{path.stem}-{config_hash([content, family.name, FORMAT_VERSION])}"


# ---------------------------------------------------------------------------- cache


def _cache_entry(fingerprint: str) -> Path:
    return cache_dir("datasets") / fingerprint


def cached_info(fingerprint: str) -> dict | None:
    """The stored summary of a converted file, or None when it was never converted."""
    info_path = _cache_entry(fingerprint) / "info.json"
    if not info_path.exists():
        return None
    return json.loads(info_path.read_text())


def convert_hdf5(path: Path, family: EnvFamily | None) -> tuple[TensorDict, EnvFamily]:
    """Reads and validates ``path`` (no cache involved); returns the dataset and its family."""
    with _open_hdf5(path) as handle:
        family = family if family is not None else detect_family(handle, path)
        arrays = _read_and_validate(handle, path, family)
    tensors = {key: torch.from_numpy(np.asarray(value)) for key, value in arrays.items()}
    data = build_transitions(
        observation=tensors["observations"],
        action=tensors["actions"],
        next_observation=tensors["next_observations"],
        reward=tensors["rewards"],
        terminated=tensors["terminals"],
        truncated=tensors["timeouts"],
    )
    return data, family


def load_hdf5(
    path: Path, family: str | EnvFamily | None = None, with_data: bool = True
) -> tuple[TensorDict | None, dict]:
    """The dataset of a D4RL-format file, converted on first use and cached afterwards.

    Args:
        path: the file.
        family: its environment family; detected from the file when None.
        with_data: False skips reading the cached data when only the summary is needed.

    Returns:
        The dataset TensorDict (in memory, batch ``[N]``; None when ``with_data`` is
        False and the file was converted before) and the cache's summary dict
        (``fingerprint``, ``family``, ``num_transitions``, ``source``).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(
            f"no file at {str(path)!r}; pass the path of an existing D4RL-format HDF5 file."
        )
    family = _resolve_family(family) if family is not None else peek_family(path)
    fingerprint = hdf5_fingerprint(path, family)
    entry = _cache_entry(fingerprint)
    info = cached_info(fingerprint)
    if info is not None and not with_data:
        return None, info
    if info is not None:
        return TensorDict.load_memmap(entry / "data").to_tensordict(), info

    data, family = convert_hdf5(path, family)
    info = {
        "fingerprint": fingerprint,
        "family": family.name,
        "num_transitions": int(data.shape[0]),
        "source": str(path.resolve()),
        "format_version": FORMAT_VERSION,
    }
    # Build the entry in a temporary directory and rename it, so a killed run never
    # leaves a half-written cache that a later run would trust.
    staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{fingerprint}."))
    try:
        data.memmap(staging / "data")
        atomic_json_dump(info, staging / "info.json")
        try:
            os.replace(staging, entry)
        except OSError:  # another process finished the same entry first
            if cached_info(fingerprint) is None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return data, info


def peek_family(path: Path) -> EnvFamily:
    """The detected family of a file, memoized per content and name (no reopening later)."""
    memo = cache_dir("datasets", "_family") / f"{config_hash([file_sha256(path), path.name])}.txt"
    if memo.exists():
        return _resolve_family(memo.read_text().strip())
    with _open_hdf5(path) as handle:
        family = detect_family(handle, path)
    memo.write_text(family.name + "\n")
    return family
