"""D4RL-format HDF5 files: validation, conversion, its cache, and which task the data names.

A D4RL-format file holds flat arrays ``observations [N, obs]``, ``next_observations
[N, obs]``, ``actions [N, act]``, ``rewards [N]``, ``terminals [N]``, ``timeouts [N]``
and optionally ``infos/*`` and ``metadata/*`` (D4RL's own downloads and the files
``scripts/collect.py`` writes). The file is read with h5py, validated, turned into the
dataset TensorDict once and stored under ``cache_dir("datasets", <fingerprint>)``;
later loads read that cache and never open the HDF5 file again. The fingerprint comes
from the file's content (SHA-256, remembered per path/size/mtime so it is computed once).

The cache is an input like the file itself, so it is stored and read without
pickle or any class named in its metadata: one raw ``.bin`` file per tensor and a
``leaves.json`` manifest (key, dtype from a fixed list of numeric ones, shape),
each file's size checked against its manifest entry before it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import torch
from tensordict import TensorDict

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.transitions import build_transitions
from cbop_torchrl.io import (
    atomic_json_dump,
    atomic_write,
    cache_dir,
    check_free_space,
    config_hash,
    disk_full_error,
    file_kind,
    is_disk_full,
    make_temporary,
    remove_stale_temporaries,
)
from cbop_torchrl.registry import families, family_of_gym_id

FORMAT_VERSION = 3
"""Bump when the conversion changes so old caches are not reused (3: raw leaves, no memmap)."""

#: The only dtypes a cache entry may hold (manifest name -> numpy dtype).
_LEAF_DTYPES = {"float32": np.float32, "bool": np.bool_, "int64": np.int64}
_LEAF_KEY = re.compile(r"^[a-z][a-z0-9_]*$")

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


def family_from_env_id(env_id: str) -> str | None:
    """The known family of a gymnasium id: ``Hopper-v4`` exactly, ``Hopper-v5`` by name, or None.

    A version other than the family's is accepted with a warning, because the
    family's gym id is what evaluation uses unless ``task.gym_id`` says otherwise.
    """
    family = family_of_gym_id(env_id)
    if family is not None:
        return family.name
    base = re.sub(r"-v\d+$", "", env_id.split("/")[-1]).lower()
    family = families().get(base)
    if family is None:
        return None
    warnings.warn(
        f"dataset recorded on {env_id!r}; it is loaded as family {family.name!r} and policies "
        f"are evaluated on {family.gym_id!r} unless task.gym_id={env_id} (with "
        "task.termination=...) is passed.",
        stacklevel=3,
    )
    return family.name


def check_family_name(family: str) -> str:
    """``family`` if it is a known task family, else a :class:`DatasetError` saying which are."""
    if family not in families():
        raise DatasetError(
            f"family={family!r} is not a known task family ({sorted(families())}); leave it "
            "out and name the environment with task.gym_id=<gymnasium id> instead."
        )
    return family


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


def detect_family(handle: h5py.File, path: Path) -> tuple[str | None, str | None]:
    """The known family and the recorded gymnasium id of an open D4RL-format file.

    The family comes from ``metadata/family``, the recorded gym id
    (``metadata/env_id``, ``gym_id`` or ``env``) or the file name's first word,
    in that order; either may be None (the ``task.*`` settings then decide).
    Sizes never decide: they are read from the arrays.
    """
    env_id = next((text for key in ENV_ID_KEYS if (text := _metadata_text(handle, key))), None)
    family = _metadata_text(handle, "family")
    if family is not None and family not in families():
        family = None  # a family this project does not know: the task settings decide
    if family is None and env_id is not None:
        family = family_from_env_id(env_id)
    if family is None:
        prefix = path.name.split("-")[0].split("_")[0].lower()
        family = prefix if prefix in families() else None
    return family, env_id


# ------------------------------------------------------------------------- validation


READ_BLOCK_ROWS = 1 << 16
"""Rows read, checked and converted to float32 at a time: loading a two-million-row file
never holds a float64 copy or a whole-array validation mask (peak memory stays near the
float32 arrays themselves)."""


def _first_bad_row(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(-1))[0])


_FLOAT32_MAX = float(np.finfo(np.float32).max)

MAX_MAGNITUDE = 1e15
"""The largest magnitude of an observation, action or reward that training can handle:
float32 sums of squares over a dataset (the normalizer's variance, squared errors) overflow
far below float32's own limit (``(1e17)**2 * 1e5 rows > 3.4e38``)."""


def _check_numeric(dataset: h5py.Dataset, key: str, where: str) -> None:
    """Refuses an array that is not real numbers or booleans (complex, strings, compounds)."""
    kind = dataset.dtype.kind
    if kind in "biuf":
        return
    what = "complex numbers" if kind == "c" else f"values of type {dataset.dtype}"
    raise DatasetError(
        f"{where}: {key} holds {what}; D4RL-format arrays must hold real numbers (float or "
        "integer; booleans for terminals and timeouts). Write the real values only (for a "
        "complex array, its real part if the imaginary part is zero)."
    )


def _read_finite_float32(dataset: h5py.Dataset, key: str, where: str) -> np.ndarray:
    """``dataset`` as a float32 array, read in blocks of :data:`READ_BLOCK_ROWS` rows.

    Each block is checked after its conversion to float32, so both NaN/inf in the
    file and finite values beyond float32's range (``|x| > 3.4e38``, e.g. float64
    ``1e300``, which become inf) are refused, naming how many rows hold them and
    the first one.
    """
    values = np.empty(dataset.shape, dtype=np.float32)
    bad_rows = {"non-finite": 0, "overflow": 0}
    first: dict[str, tuple[int, float]] = {}
    for start in range(0, dataset.shape[0], READ_BLOCK_ROWS):
        block = dataset[start : start + READ_BLOCK_ROWS]
        with np.errstate(over="ignore", invalid="ignore"):
            converted = block.astype(np.float32)
        finite = np.isfinite(converted)
        if not finite.all():
            source_finite = np.isfinite(block)
            for kind, bad in (
                ("non-finite", ~source_finite),
                ("overflow", source_finite & ~finite),
            ):
                rows = np.flatnonzero(bad.reshape(bad.shape[0], -1).any(-1))
                bad_rows[kind] += rows.size
                if rows.size and kind not in first:
                    row = int(rows[0])
                    first[kind] = (
                        start + row,
                        float(block[row].reshape(-1)[bad[row].reshape(-1)][0]),
                    )
        values[start : start + block.shape[0]] = converted
    if bad_rows["non-finite"]:
        row, value = first["non-finite"]
        raise DatasetError(
            f"{where}: {key} has a non-finite value (NaN or inf) in {bad_rows['non-finite']} "
            f"row(s), the first at row {row} ({value}); every observation, action and reward "
            "must be finite. Drop or repair those rows."
        )
    if not bad_rows["overflow"] and values.size:
        largest = float(np.abs(values).max())
        if largest > MAX_MAGNITUDE:
            rows = np.flatnonzero(
                (np.abs(values) > MAX_MAGNITUDE).reshape(values.shape[0], -1).any(-1)
            )
            raise DatasetError(
                f"{where}: {key} has values up to {largest:.3g} in magnitude ({rows.size} "
                f"row(s) beyond {MAX_MAGNITUDE:.0e}, the first at row {int(rows[0])}); training "
                "sums their squares in float32 (the normalizer's variance, squared errors), "
                "which overflows to inf at this scale, whatever the learning rate. Rescale "
                f"{key} to ordinary magnitudes (divide by a constant) or drop those rows."
            )
    if bad_rows["overflow"]:
        row, value = first["overflow"]
        raise DatasetError(
            f"{where}: {key} has values beyond float32's range (|x| > {_FLOAT32_MAX:.3g}) in "
            f"{bad_rows['overflow']} row(s), the first at row {row} ({value:.3g}); training "
            "converts the data to float32, where they would become inf. Drop or rescale those "
            "rows."
        )
    return values


def _dataset_or_refuse(handle: h5py.File, key: str, where: str) -> h5py.Dataset:
    """``handle[key]`` when it is an array; a :class:`DatasetError` naming the key otherwise
    (a group, a link to a file that cannot be opened, a named type)."""
    link = handle.get(key, getlink=True)
    try:
        value = handle[key]
    except (KeyError, OSError, RuntimeError) as error:
        if isinstance(link, h5py.SoftLink):  # a loop of soft links, or one to nothing
            raise DatasetError(
                f"{where}: {key} is a soft link to {link.path!r} that cannot be followed "
                f"({error}): a loop of links or a link to nothing. Write the array itself "
                f"under {key}."
            ) from None
        if isinstance(link, h5py.ExternalLink):
            raise DatasetError(
                f"{where}: {key} is a link to {link.path!r} in the file {link.filename!r}, "
                f"which cannot be opened ({error}); put that file where the link points "
                "(beside this one for a relative name) or write the array into this file."
            ) from None
        raise DatasetError(f"{where}: {key} cannot be read ({error}).") from None
    if not isinstance(value, h5py.Dataset):
        what = "a group (a folder of arrays)" if isinstance(value, h5py.Group) else "not an array"
        raise DatasetError(
            f"{where}: {key} is {what}, where a D4RL-format file has an array with one "
            f"entry per transition; write {key} as an array (e.g. handle[{key!r}] = values)."
        )
    return value


def _read_and_validate(handle: h5py.File, path: Path) -> dict[str, np.ndarray]:
    """All required arrays of ``handle``, checked for keys, shapes, row counts and values.

    Shapes and row counts are checked on the file's metadata before any data is read;
    observations, next observations, actions and rewards come back as float32
    (:func:`_read_finite_float32`), terminals and timeouts in the file's dtype.
    """
    where = f"D4RL-format file {str(path)!r}"
    # a link that cannot be followed is not missing: _dataset_or_refuse names it
    missing = [key for key in REQUIRED_KEYS if handle.get(key, getlink=True) is None]
    if missing:
        raise DatasetError(
            f"{where} lacks the key(s) {missing}; a D4RL-format file needs {list(REQUIRED_KEYS)} "
            f"(it has {sorted(handle.keys())}). Write next_observations explicitly (D4RL v2 "
            "files and cbop-collect do) and timeouts as all-False if no episode was cut."
        )
    for key in REQUIRED_KEYS:
        _dataset_or_refuse(handle, key, where)
    shapes = {key: tuple(handle[key].shape) for key in REQUIRED_KEYS}

    for key in ("observations", "next_observations", "actions"):
        shape = shapes[key]
        if len(shape) != 2 or shape[1] == 0:
            raise DatasetError(
                f"{where}: {key} has shape {list(shape)}; it needs one non-empty row per "
                "transition, [N, size]."
            )
    obs_width, next_width = shapes["observations"][1], shapes["next_observations"][1]
    if obs_width != next_width:
        raise DatasetError(
            f"{where}: observations are [N, {obs_width}] but next_observations are "
            f"[N, {next_width}]; both must have the environment's observation size."
        )
    for key in ("rewards", "terminals", "timeouts"):
        shape = shapes[key]
        if len(shape) == 2 and shape[1] == 1:
            shapes[key] = shape = shape[:1]
        if len(shape) != 1:
            raise DatasetError(
                f"{where}: {key} has shape {list(shape)}, expected one value per row, [N]."
            )

    for key in REQUIRED_KEYS:
        _check_numeric(handle[key], key, where)
    num_rows = shapes["observations"][0]
    for key, shape in shapes.items():
        if shape[0] != num_rows:
            raise DatasetError(
                f"{where}: {key} has {shape[0]} rows but observations has {num_rows}; "
                f"every key must have one entry per transition (first bad row: "
                f"{min(shape[0], num_rows)}). The file is probably truncated or was "
                "written from buffers of different lengths."
            )
    if num_rows == 0:
        raise DatasetError(f"{where} holds no transitions; it needs at least one row.")

    arrays = {
        key: _read_finite_float32(handle[key], key, where)
        for key in ("observations", "next_observations", "actions", "rewards")
    }
    arrays["rewards"] = arrays["rewards"].reshape(num_rows)
    for key in ("terminals", "timeouts"):
        flags = arrays[key] = handle[key][()].reshape(num_rows)
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


# ---------------------------------------------------------------------- fingerprint


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, memoized on disk per (path, size, mtime)."""
    stat = path.stat()
    key = config_hash([str(path.resolve()), stat.st_size, stat.st_mtime_ns], length=24)
    memo = cache_dir("datasets", "_sha256") / f"{key}.txt"
    if memo.is_file() and re.fullmatch(r"[0-9a-f]{64}", text := memo.read_text().strip()):
        return text
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    remove_stale_temporaries(memo.parent)
    # written atomically: an empty memo (a kill or a full disk mid-write) would give every
    # file the same fingerprint
    atomic_write(memo, lambda tmp: tmp.write_text(digest.hexdigest() + "\n"))
    return digest.hexdigest()


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
    with _open_hdf5(path) as handle:

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


# ---------------------------------------------------------------------------- cache


def _cache_entry(fingerprint: str) -> Path:
    return cache_dir("datasets") / fingerprint


def cached_info(fingerprint: str) -> dict | None:
    """The stored summary of a converted file, or None when it was never converted."""
    info_path = _cache_entry(fingerprint) / "info.json"
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


def _read_cached_data(path: Path) -> TensorDict:
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


def convert_hdf5(path: Path) -> tuple[TensorDict, str | None, str | None]:
    """Reads and validates ``path`` (no cache involved).

    Returns:
        The dataset, the known family it was recognised as (or None) and the
        gymnasium id its metadata records (or None).
    """
    with _open_hdf5(path) as handle:
        family, env_id = detect_family(handle, path)
        arrays = _read_and_validate(handle, path)
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
    if not path.is_file():
        if path.exists():  # a folder, a FIFO (never opened: it would block), a device
            raise DatasetError(
                f"{str(path)!r} is {file_kind(path)}, not a file; pass the path of a "
                "D4RL-format HDF5 file."
            )
        raise DatasetError(
            f"no file at {str(path)!r}; pass the path of an existing D4RL-format HDF5 file."
        )
    check_hdf5_signature(path)  # a large file of another format is refused before hashing
    content = content_key(path)
    fingerprint = hdf5_fingerprint(path, content)
    entry = _cache_entry(fingerprint)
    info = cached_info(fingerprint)
    if info is not None and not with_data:
        return None, {**info, "sha256": content}
    if info is not None:
        return _read_cached_data(entry / "data"), {**info, "sha256": content}

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
    _store_cache_entry(data, info, entry)
    del data  # read back below, so a first load returns what later loads will
    return _read_cached_data(entry / "data"), {**info, "sha256": content}


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


def _store_cache_entry(data: TensorDict, info: dict, entry: Path) -> None:
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
        if is_disk_full(error):
            raise disk_full_error(entry.parent, needed) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)
