"""Which known task family a D4RL-format file's data comes from."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import h5py

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5.layout import metadata_text
from cbop_torchrl.registry import families, family_in_name, family_of_gym_id

ENV_ID_KEYS = ("env_id", "gym_id", "env")
"""``metadata/<key>`` names read as the gymnasium id the data was recorded on."""


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


def detect_family(handle: h5py.File, path: Path) -> tuple[str | None, str | None]:
    """The known family and the recorded gymnasium id of an open D4RL-format file.

    The family comes from ``metadata/family``, the recorded gym id
    (``metadata/env_id``, ``gym_id`` or ``env``) or the family the file name names
    (:func:`cbop_torchrl.registry.family_in_name`),
    in that order; either may be None (the ``task.*`` settings then decide).
    Sizes never decide: they are read from the arrays.
    """
    env_id = next((text for key in ENV_ID_KEYS if (text := metadata_text(handle, key))), None)
    family = metadata_text(handle, "family")
    if family is not None and family not in families():
        family = None  # a family this project does not know: the task settings decide
    if family is None and env_id is not None:
        family = family_from_env_id(env_id)
    if family is None:
        family = family_in_name(path.name)
    return family, env_id
