"""D4RL-format HDF5 files: validation, conversion, its cache, and which task the data names.

A D4RL-format file (:mod:`~cbop_torchrl.data.hdf5.layout`) is read with h5py, validated
(:mod:`~cbop_torchrl.data.hdf5.validate`), turned into the dataset TensorDict once and
stored under ``cache_dir("datasets", <fingerprint>)`` (:mod:`~cbop_torchrl.data.hdf5.cache`);
later loads read that cache and never open the HDF5 file again. The fingerprint comes
from the file's content and that of the files it links to (SHA-256, remembered per
path/size/mtime so it is computed once: :mod:`~cbop_torchrl.data.hdf5.hashing`,
:mod:`~cbop_torchrl.data.hdf5.links`). Which task the data comes from is read from its
metadata or its name (:mod:`~cbop_torchrl.data.hdf5.family`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5.cache import (
    FORMAT_VERSION,
    cache_entry,
    cached_info,
    read_cached_data,
    store_cache_entry,
)
from cbop_torchrl.data.hdf5.family import (
    ENV_ID_KEYS,
    check_family_name,
    detect_family,
    family_from_env_id,
)
from cbop_torchrl.data.hdf5.hashing import (
    content_key,
    file_sha256,
    hdf5_fingerprint,
    sha256_of_file,
)
from cbop_torchrl.data.hdf5.layout import (
    HDF5_SIGNATURE,
    REQUIRED_KEYS,
    Arrays,
    check_hdf5_signature,
    metadata_text,
    open_hdf5,
    read_d4rl_hdf5,
    write_d4rl_hdf5,
)
from cbop_torchrl.data.hdf5.links import linked_files
from cbop_torchrl.data.hdf5.validate import MAX_MAGNITUDE, READ_BLOCK_ROWS, read_and_validate
from cbop_torchrl.data.transitions import build_transitions
from cbop_torchrl.io import require_regular_file


def convert_hdf5(path: Path) -> tuple[TensorDict, str | None, str | None]:
    """Reads and validates ``path`` (no cache involved).

    Returns:
        The dataset, the known family it was recognised as (or None) and the
        gymnasium id its metadata records (or None).
    """
    with open_hdf5(path) as handle:
        family, env_id = detect_family(handle, path)
        arrays = read_and_validate(handle, path)
    tensors = {key: torch.from_numpy(value) for key, value in arrays.items()}
    del arrays  # the tensors share their memory; build_transitions keeps what it needs
    data = build_transitions(
        observation=tensors["observations"],
        action=tensors["actions"],
        next_observation=tensors["next_observations"],
        reward=tensors["rewards"],
        terminated=tensors["terminals"],
        truncated=tensors["timeouts"],
        copy=False,  # fresh arrays read for this call: no defensive copies
    )
    return data, family, env_id


def load_hdf5(path: Path, with_data: bool = True) -> tuple[TensorDict | None, dict]:
    """The dataset of a D4RL-format file, converted on first use and cached afterwards.

    Args:
        path: the file.
        with_data: False skips reading the cached data when only the summary is needed.

    Returns:
        The dataset TensorDict (in memory, batch ``[N]``; None when ``with_data`` is
        False and the file was converted before) and the cache's summary dict
        (``fingerprint``, ``family``, ``env_id``, ``obs_dim``, ``action_dim``,
        ``num_transitions``, ``source``).
    """
    path = Path(path)
    require_regular_file(
        path,
        DatasetError,
        "a file",
        "pass the path of a D4RL-format HDF5 file.",
        f"no file at {str(path)!r}; pass the path of an existing D4RL-format HDF5 file.",
    )
    check_hdf5_signature(path)  # a large file of another format is refused before hashing
    content = content_key(path)
    fingerprint = hdf5_fingerprint(path, content)
    entry = cache_entry(fingerprint)
    info = cached_info(fingerprint)
    if info is not None and not with_data:
        return None, {**info, "sha256": content}
    if info is not None:
        return read_cached_data(entry / "data"), {**info, "sha256": content}

    data, family, env_id = convert_hdf5(path)
    info = {
        "fingerprint": fingerprint,
        "family": family,
        "env_id": env_id,
        "obs_dim": int(data["observation"].shape[-1]),
        "action_dim": int(data["action"].shape[-1]),
        "num_transitions": int(data.shape[0]),
        "source": str(path.resolve()),
        "format_version": FORMAT_VERSION,
    }
    store_cache_entry(data, info, entry)
    del data  # read back below, so a first load returns what later loads will
    return read_cached_data(entry / "data"), {**info, "sha256": content}


__all__ = [
    "Arrays",
    "ENV_ID_KEYS",
    "FORMAT_VERSION",
    "HDF5_SIGNATURE",
    "MAX_MAGNITUDE",
    "READ_BLOCK_ROWS",
    "REQUIRED_KEYS",
    "cached_info",
    "check_family_name",
    "check_hdf5_signature",
    "content_key",
    "convert_hdf5",
    "detect_family",
    "family_from_env_id",
    "file_sha256",
    "hdf5_fingerprint",
    "linked_files",
    "load_hdf5",
    "metadata_text",
    "read_d4rl_hdf5",
    "sha256_of_file",
    "write_d4rl_hdf5",
]
