"""``minari:<dataset id>`` through TorchRL's ``MinariExperienceReplay``.

Where the data comes from, in order: TorchRL's converted copy under
``<torchrl_root>/minari/<id>`` (no network); a locally stored Minari dataset under
``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets`` (converted by TorchRL, no
network); otherwise Minari's remote download into that store
(``minari.download_dataset``), then the conversion. The conversion runs in a
child process (:func:`cbop_torchrl._torchrl_compat.convert_minari_dataset`: it
works around a TorchRL bug by replacing a TensorDict method, which must not
happen in the caller's process). Minari keeps every episode's final
observation, so next observations are real everywhere.

Minari's MuJoCo sets are recorded on ``*-v5`` environments and are not D4RL data:
the family comes from the dataset's env spec (``Hopper-v5`` -> ``hopper``), with a
warning that evaluation uses the family's gym id unless ``task.gym_id`` says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data.datasets import MinariExperienceReplay

from cbop_torchrl._torchrl_compat import convert_minari_dataset
from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5 import FORMAT_VERSION, family_from_env_id
from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.data.safe_memmap import check_tensors_only
from cbop_torchrl.data.transitions import build_transitions
from cbop_torchrl.io import config_hash


def local_minari_path(dataset_id: str) -> Path:
    """Where Minari stores ``dataset_id`` on this machine."""
    root = os.environ.get("MINARI_DATASETS_PATH", Path.home() / ".minari" / "datasets")
    return Path(root) / dataset_id


def load_minari(
    dataset_id: str, family: str | None = None, *, torchrl_root: str | Path | None = None
):
    """Dataset and :class:`~cbop_torchrl.data.info.DatasetInfo` of a Minari dataset."""
    base = Path(torchrl_root) if torchrl_root else Path.home() / ".cache" / "torchrl"
    root = base / "minari"
    converted = (root / dataset_id).exists()
    if not converted:
        local = (local_minari_path(dataset_id) / "data" / "main_data.hdf5").is_file()
        try:
            import minari
        except ImportError as err:
            raise DatasetError(
                f"minari:{dataset_id} needs the minari package ({err}); install it with "
                "`pip install 'cbop-torchrl[minari]'`."
            ) from None
        if not local:
            try:  # into Minari's local store, where the conversion reads it
                minari.download_dataset(dataset_id)
            except Exception as err:  # Minari's download raises many error types
                raise DatasetError(
                    f"Minari dataset {dataset_id!r} is neither converted by TorchRL under "
                    f"{str(root / dataset_id)!r} nor stored locally under "
                    f"{str(local_minari_path(dataset_id))!r}, and downloading it failed "
                    f"({err!r}). Check the id with `minari list remote`, download it on a "
                    "machine with network access (`minari download <id>`) and copy "
                    "~/.minari/datasets/<id> here, or use a D4RL-format HDF5 file instead."
                ) from None
        try:
            convert_minari_dataset(dataset_id, root)
        except RuntimeError as err:
            raise DatasetError(
                f"TorchRL could not convert Minari dataset {dataset_id!r} from "
                f"{str(local_minari_path(dataset_id))!r}: {err}"
            ) from None
    check_tensors_only(  # TorchRL's load_memmap would unpickle a non-tensor field
        root / dataset_id,
        f"TorchRL's copy of Minari dataset {dataset_id!r}",
        "Delete that directory and load the dataset again.",
        extra_files=("env_metadata.json",),
    )
    try:
        buffer = MinariExperienceReplay(dataset_id, batch_size=1, root=root, download=False)
    except Exception as err:  # a damaged copy fails in many ways
        raise DatasetError(
            f"TorchRL's copy of Minari dataset {dataset_id!r} at {str(root / dataset_id)!r} "
            f"cannot be read ({err!r}); delete that directory and load it again."
        ) from None

    stored = buffer.storage.get(slice(None))
    where = f"Minari dataset {dataset_id!r} (TorchRL cache {str(root / dataset_id)!r})"
    env_spec = (buffer.metadata or {}).get("env_spec") or {}
    env_id = env_spec.get("id")
    if family is None and env_id:
        family = family_from_env_id(env_id)
    data = _to_dataset(stored, where)
    content = [float(data[key].double().sum()) for key in ("observation", ("next", "reward"))]
    fingerprint = config_hash([dataset_id, FORMAT_VERSION, int(data.shape[0]), content])
    name = dataset_id.replace("/", "-")
    info = DatasetInfo(
        name=dataset_id,
        fingerprint=f"minari-{name}-{fingerprint}",
        num_transitions=int(data.shape[0]),
        source_kind="minari",
        obs_dim=int(data["observation"].shape[-1]),
        action_dim=int(data["action"].shape[-1]),
        family=family,
        env_id=env_id,
    )
    return data, info


def _to_dataset(stored: TensorDict, where: str) -> TensorDict:
    observation = stored.get("observation")
    if not isinstance(observation, torch.Tensor):
        raise DatasetError(
            f"{where} has structured (dict) observations; only flat vector observations "
            "are supported."
        )
    if observation.numel() and not observation.any():
        raise DatasetError(
            f"{where}: every observation is zero, the signature of TorchRL 0.14.1's Minari "
            "conversion bug. Delete that directory and load the dataset again."
        )
    for key in ("observation", ("next", "observation"), "action", ("next", "reward")):
        finite = torch.isfinite(stored[key]).reshape(stored.shape[0], -1).all(-1)
        if not finite.all():
            raise DatasetError(
                f"{where}: {key} has a non-finite value at row "
                f"{int((~finite).nonzero()[0])}; every value must be finite."
            )
    return build_transitions(
        observation,
        stored["action"],
        stored["next", "observation"],
        stored["next", "reward"],
        stored["next", "terminated"],
        stored["next", "truncated"],
    )
