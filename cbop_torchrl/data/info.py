""":class:`DatasetInfo`: what a run knows about its dataset without holding the data.

Its own module so that every loader (:mod:`~cbop_torchrl.data.hdf5`,
:mod:`~cbop_torchrl.data.d4rl`, :mod:`~cbop_torchrl.data.minari`) and the
dispatcher above them (:mod:`~cbop_torchrl.data.sources`) share it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbop_torchrl.registry import EnvFamily


@dataclass(frozen=True)
class DatasetInfo:
    """What a run needs to know about its dataset without holding the data.

    Attributes:
        name: clean id for logs and run names (``hopper-medium-replay-v2``,
            the file stem of an HDF5 file, the Minari id).
        family: the environment family the data was recorded on.
        fingerprint: stable string identifying the data, for cache keys.
        num_transitions: rows in the dataset TensorDict.
        source_kind: ``"d4rl"``, ``"hdf5"``, ``"minari"`` or ``"demo"``.
    """

    name: str
    family: EnvFamily
    fingerprint: str
    num_transitions: int
    source_kind: str
