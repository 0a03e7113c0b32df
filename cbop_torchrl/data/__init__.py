"""Offline datasets: every source becomes one TensorDict with TorchRL's keys.

    >>> from cbop_torchrl.data import load_dataset, dataset_info, make_replay_buffer
    >>> data = load_dataset("demo")            # or "hopper-medium-replay-v2", a .hdf5 path,
    >>> info = dataset_info("demo")            # or "minari:mujoco/hopper/medium-v0"
    >>> buffer = make_replay_buffer(data, batch_size=256, device="cpu", seed=0)
    >>> batch = buffer.sample()                # TensorDict of batch [256]

See :mod:`cbop_torchrl.data.transitions` for the keys and their exact meaning.
"""

from cbop_torchrl.data.errors import GENERATE_COMMAND, DatasetError, generate_command
from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.data.replay import make_replay_buffer
from cbop_torchrl.data.sources import (
    DEMO_DATASET_PATH,
    data_record,
    dataset_info,
    load_dataset,
    load_dataset_with_info,
)
from cbop_torchrl.data.transitions import DATASET_KEYS, build_transitions

__all__ = [
    "DATASET_KEYS",
    "DEMO_DATASET_PATH",
    "GENERATE_COMMAND",
    "DatasetError",
    "DatasetInfo",
    "build_transitions",
    "data_record",
    "dataset_info",
    "generate_command",
    "load_dataset",
    "load_dataset_with_info",
    "make_replay_buffer",
]
