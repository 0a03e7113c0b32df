"""Validation of a D4RL-format file's arrays: keys, shapes, row counts and values."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5.layout import REQUIRED_KEYS

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


def read_and_validate(handle: h5py.File, path: Path) -> dict[str, np.ndarray]:
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
