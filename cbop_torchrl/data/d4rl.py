"""D4RL ids through TorchRL's ``D4RLExperienceReplay``, with the real next observations.

TorchRL downloads the D4RL file (``direct_download=True``: h5py only), converts it and
memory-maps it under ``<torchrl_root>/d4rl/<id>``; when that directory exists it is
reloaded with ``download=False`` and no network call. Its stored data differs from
the raw file in three ways we undo or account for:

- the top-level ``reward``/``done`` are shifted one step; we read the ``("next", ...)``
  entries, which hold each row's own values;
- the file's last row is dropped (it becomes the previous row's cut end);
- ``("next", "observation")`` is zeroed at done rows. :class:`D4RLKeepingNextObs`
  also stores the un-zeroed copy, ``("next", "unzeroed_observation")``, in the same
  cache. A cache written by stock TorchRL lacks it: then terminal rows get their own
  observation as a placeholder (they never bootstrap) and are left out of the
  dynamics mask, timeout rows with a lost next observation are dropped (as D4RL's
  ``qlearning_dataset`` does), and a warning says how to rebuild the cache.

Offline without a TorchRL cache, the raw D4RL file placed in
``cache_dir("d4rl")`` (e.g. ``hopper_medium_replay-v2.hdf5``) is used instead.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data.datasets import D4RLExperienceReplay
from torchrl.data.datasets.d4rl_infos import D4RL_DATASETS

from cbop_torchrl.data.errors import DatasetError, generate_command
from cbop_torchrl.data.hdf5 import FORMAT_VERSION, load_hdf5
from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.data.safe_memmap import check_tensors_only
from cbop_torchrl.data.transitions import build_transitions
from cbop_torchrl.io import cache_dir, config_hash
from cbop_torchrl.registry import parse_d4rl_id

UNZEROED_NEXT_OBS = ("next", "unzeroed_observation")


class D4RLKeepingNextObs(D4RLExperienceReplay):
    """``D4RLExperienceReplay`` that also caches the next observations before zeroing.

    TorchRL overwrites ``("next", "observation")`` with zeros at done rows after the
    conversion below; the copy under :data:`UNZEROED_NEXT_OBS` survives into the cache.
    """

    def _process_data_from_env(self, dataset, env=None):
        dataset = super()._process_data_from_env(dataset, env)
        dataset.set(UNZEROED_NEXT_OBS, dataset.get(("next", "observation")).clone())
        return dataset


def torchrl_d4rl_root(torchrl_root: str | Path | None) -> Path:
    """Where TorchRL keeps converted D4RL datasets (``~/.cache/torchrl/d4rl`` by default)."""
    base = Path(torchrl_root) if torchrl_root else Path.home() / ".cache" / "torchrl"
    return base / "d4rl"


def raw_file_name(dataset_id: str) -> str:
    """File name of the D4RL download, e.g. ``hopper_medium_replay-v2.hdf5``."""
    return os.path.basename(D4RL_DATASETS[dataset_id])


def load_d4rl(dataset_id: str, *, torchrl_root: str | Path | None = None):
    """Dataset and :class:`~cbop_torchrl.data.info.DatasetInfo` of a D4RL id."""
    family, kind = parse_d4rl_id(dataset_id)
    root = torchrl_d4rl_root(torchrl_root)
    raw_file = cache_dir("d4rl") / raw_file_name(dataset_id)
    if not (root / dataset_id).exists() and raw_file.is_file():
        data, summary = load_hdf5(raw_file)
        info = DatasetInfo(
            name=dataset_id,
            fingerprint=summary["fingerprint"],
            num_transitions=summary["num_transitions"],
            source_kind="d4rl",
            obs_dim=summary["obs_dim"],
            action_dim=summary["action_dim"],
            family=family.name,
        )
        return data, info

    cached = os.path.lexists(root / dataset_id)
    if cached:  # TorchRL's load_memmap would unpickle a non-tensor field: tensors only
        check_tensors_only(
            root / dataset_id,
            f"TorchRL's cache of {dataset_id!r}",
            "Delete that directory and load the id again with network access, or load the "
            "raw D4RL .hdf5 file by its path.",
        )
    try:
        buffer = D4RLKeepingNextObs(
            dataset_id, batch_size=1, root=root, direct_download=True, download=not cached
        )
    except Exception as err:
        if cached:
            raise DatasetError(
                f"TorchRL's cache of {dataset_id!r} at {str(root / dataset_id)!r} cannot be "
                f"read ({err!r}); it is probably incomplete. Delete that directory and load "
                "the id again with network access, or load the raw D4RL .hdf5 file by its path."
            ) from None
        if not isinstance(err, OSError):  # urllib's URLError/HTTPError/timeouts are OSErrors
            raise
        raise DatasetError(
            f"D4RL dataset {dataset_id!r} is not cached and could not be downloaded ({err}). "
            f"TorchRL's cache for it would be {str(root / dataset_id)!r}. Either run this on a "
            f"machine with network access and copy that directory here, or download "
            f"{D4RL_DATASETS[dataset_id]} and place it at {str(raw_file)!r} (or pass the "
            f"file's path: env=<path> on the command line, load_dataset(<path>) in "
            f"Python). Without D4RL, generate a look-alike with "
            f"`{generate_command(family.name, kind)}` and load the .hdf5 file it writes."
        ) from None
    stored = buffer.storage.get(slice(None))
    data, complete = _from_torchrl(stored, root / dataset_id)
    fingerprint = config_hash(
        [dataset_id, FORMAT_VERSION, complete, int(data.shape[0])]
    )  # D4RL files never change: the id (and how we read it) identifies the data
    info = DatasetInfo(
        name=dataset_id,
        fingerprint=f"{dataset_id}-{fingerprint}",
        num_transitions=int(data.shape[0]),
        source_kind="d4rl",
        obs_dim=int(data["observation"].shape[-1]),
        action_dim=int(data["action"].shape[-1]),
        family=family.name,
    )
    return data, info


def _from_torchrl(stored: TensorDict, cache_path: Path) -> tuple[TensorDict, bool]:
    """Our dataset from TorchRL's stored D4RL data; also whether nothing was lost."""
    observation = stored["observation"]
    terminated = stored["next", "terminated"].reshape(-1).bool()
    truncated = stored.get(("next", "truncated"), torch.zeros_like(terminated))
    truncated = truncated.reshape(-1).bool() & ~terminated
    next_observation = stored.get(UNZEROED_NEXT_OBS, None)
    if next_observation is not None:
        data = build_transitions(
            observation,
            stored["action"],
            next_observation,
            stored["next", "reward"],
            terminated,
            truncated,
        )
        return data, True

    next_observation = stored["next", "observation"]
    lost = (terminated | truncated) & (next_observation == 0).all(-1)
    warnings.warn(
        f"TorchRL's D4RL cache {str(cache_path)!r} was written without the real next "
        f"observations of its {int(lost.sum())} done rows (TorchRL zeroes them). Terminal "
        "rows are kept but left out of dynamics training; timeout rows are dropped. To keep "
        "them, delete that directory and load the id again with network access, or load "
        "the raw D4RL .hdf5 file by its path.",
        stacklevel=3,
    )
    keep = ~(lost & truncated)
    next_observation = torch.where(lost[:, None], observation, next_observation)
    data = build_transitions(
        observation[keep],
        stored["action"][keep],
        next_observation[keep],
        stored["next", "reward"][keep],
        terminated[keep],
        truncated[keep],
        dynamics_usable=~lost[keep],
    )
    return data, False
