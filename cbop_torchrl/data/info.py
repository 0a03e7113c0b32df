""":class:`DatasetInfo`: what a run knows about its dataset without holding the data.

Its own module so that every loader (:mod:`~cbop_torchrl.data.hdf5`,
:mod:`~cbop_torchrl.data.d4rl`, :mod:`~cbop_torchrl.data.minari`) and the
dispatcher above them (:mod:`~cbop_torchrl.data.sources`) share it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    """What a run needs to know about its dataset without holding the data.

    Sizes come from the data's tensors; which environment the data belongs to
    is resolved from ``family``/``env_id`` and the ``task.*`` settings by
    :func:`cbop_torchrl.envs.task.resolve_task`.

    Attributes:
        name: clean id for logs and run names (``hopper-medium-replay-v2``,
            the file stem of an HDF5 file, the Minari id).
        fingerprint: stable string identifying the data, for cache keys.
        num_transitions: rows in the dataset TensorDict.
        source_kind: ``"d4rl"``, ``"hdf5"``, ``"minari"`` or ``"demo"``.
        obs_dim: width of ``observation`` (and ``("next", "observation")``).
        action_dim: width of ``action``.
        family: the known task family the data was recognised as (from a D4RL id,
            ``metadata/family``, the recorded gym id or the file name), or None.
        env_id: the gymnasium id recorded in the data's metadata, or None.
        source: the source string as given (``env=...``), for messages.
        sha256: SHA-256 of the data file's bytes (HDF5 files and the demo), else None.
    """

    name: str
    fingerprint: str
    num_transitions: int
    source_kind: str
    obs_dim: int
    action_dim: int
    family: str | None = None
    env_id: str | None = None
    source: str = ""
    sha256: str | None = None
