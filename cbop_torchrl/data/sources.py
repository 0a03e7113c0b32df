"""``load_dataset``/``dataset_info``: one entry point for every offline dataset source.

A source string is one of

- a D4RL id such as ``"hopper-medium-replay-v2"`` (through TorchRL's
  ``D4RLExperienceReplay``; see :mod:`cbop_torchrl.data.d4rl`),
- a path to a D4RL-format HDF5 file (see :mod:`cbop_torchrl.data.hdf5`),
- ``"minari:<dataset id>"`` (through TorchRL's ``MinariExperienceReplay``),
- ``"demo"``: the small hopper dataset bundled with the package.

Whatever the source, the result is the TensorDict described in
:mod:`cbop_torchrl.data.transitions`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from tensordict import TensorDict

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.hdf5 import check_family_name, load_hdf5
from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.registry import d4rl_ids, parse_d4rl_id
from cbop_torchrl.runtime import program_command

DEMO_DATASET_PATH = (
    Path(__file__).resolve().parents[1] / "assets" / "hopper-demo-medium-replay-gen.hdf5"
)
"""The bundled default dataset (``load_dataset("demo")``)."""


def demo_command() -> str:
    """The command that makes the demo file where the package looks for it, for the user's
    shell (the provenance file beside the file records the same settings)."""
    return (
        f"{program_command('cbop-collect')} env=hopper kind=medium-replay seed=0 tag=demo "
        f"out_dir={DEMO_DATASET_PATH.parent} sac.total_steps=100000 sac.eval_episodes=5 "
        "medium_reference=best medium_min_normalized=null stop_at_medium=false"
    )


MINARI_PREFIX = "minari:"


def load_dataset(
    source: str | Path,
    family: str | None = None,
    *,
    torchrl_root: str | Path | None = None,
) -> TensorDict:
    """The dataset TensorDict of ``source`` (see the module docstring for sources).

    Args:
        source: D4RL id, path to a D4RL-format HDF5 file, ``minari:<id>`` or ``demo``.
        family: a known task family name (``hopper``) to record the data as, when
            neither its name nor its metadata says so; other environments are named
            with ``task.*`` settings instead (:mod:`cbop_torchrl.envs.task`).
        torchrl_root: root of TorchRL's dataset caches (default ``~/.cache/torchrl``);
            D4RL data lives in ``<root>/d4rl/<id>``, Minari data in ``<root>/minari/<id>``.

    Returns:
        TensorDict of batch ``[N]``; keys in :data:`cbop_torchrl.data.DATASET_KEYS`.

    Raises:
        DatasetError: unknown source, data not available offline, or invalid file.
    """
    return load_dataset_with_info(source, family, torchrl_root=torchrl_root)[0]


def dataset_info(
    source: str | Path,
    family: str | None = None,
    *,
    torchrl_root: str | Path | None = None,
) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``source``.

    Converts the data on first use; a converted HDF5 file (or the demo) is then
    answered from its cache summary without loading the data.
    """
    return _dispatch(source, family, torchrl_root, with_data=False)[1]


def load_dataset_with_info(
    source: str | Path,
    family: str | None = None,
    *,
    torchrl_root: str | Path | None = None,
) -> tuple[TensorDict, DatasetInfo]:
    """``load_dataset`` and ``dataset_info`` in one pass."""
    return _dispatch(source, family, torchrl_root, with_data=True)


def _dispatch(
    source: str | Path,
    family: str | None,
    torchrl_root: str | Path | None,
    with_data: bool,
) -> tuple[TensorDict | None, DatasetInfo]:
    text = str(source)
    if family is not None:
        check_family_name(family)
    if text == "demo":
        if not DEMO_DATASET_PATH.is_file():
            raise DatasetError(
                f"the bundled demo dataset is missing: expected {str(DEMO_DATASET_PATH)!r}. "
                f"Regenerate it with `{demo_command()}` (the provenance file beside it "
                "records the seed and size), "
                "or pass another source: a D4RL id, a D4RL-format HDF5 path or minari:<id>."
            )
        return _from_hdf5(DEMO_DATASET_PATH, family, "demo", with_data)
    if text.startswith(MINARI_PREFIX):
        from cbop_torchrl.data.minari import load_minari

        data, info = load_minari(text[len(MINARI_PREFIX) :], family, torchrl_root=torchrl_root)
        return data, dataclasses.replace(info, source=text)
    parsed = parse_d4rl_id(text)
    if parsed is not None:
        from cbop_torchrl.data.d4rl import load_d4rl

        if family is not None and family != parsed[0].name:
            raise DatasetError(
                f"{text!r} is a {parsed[0].name} dataset but family={family!r} was passed; "
                "drop the family argument for D4RL ids."
            )
        data, info = load_d4rl(text, torchrl_root=torchrl_root)
        return data, dataclasses.replace(info, source=text)
    path = Path(text).expanduser()
    if path.exists() or path.suffix in (".hdf5", ".h5"):  # a folder or FIFO: named as such
        return _from_hdf5(path, family, "hdf5", with_data)
    raise DatasetError(
        f"unknown dataset source {text!r}. Valid D4RL ids are {', '.join(d4rl_ids())}. "
        "To use data you have locally, pass the path of a D4RL-format HDF5 file (keys "
        "observations, next_observations, actions, rewards, terminals, timeouts), "
        "'minari:<dataset id>' for a Minari dataset, or 'demo' for the bundled hopper dataset."
    )


def _from_hdf5(
    path: Path, family: str | None, kind: str, with_data: bool
) -> tuple[TensorDict | None, DatasetInfo]:
    data, summary = load_hdf5(path, with_data=with_data)
    info = DatasetInfo(
        name=path.stem,
        fingerprint=summary["fingerprint"],
        num_transitions=summary["num_transitions"],
        source_kind=kind,
        obs_dim=summary["obs_dim"],
        action_dim=summary["action_dim"],
        family=family or summary["family"],
        env_id=summary["env_id"],
        source=str(path) if kind != "demo" else "demo",
        sha256=summary.get("sha256"),
    )
    return data, info


def data_record(info: DatasetInfo) -> dict:
    """What identifies the data of a run, stored in its run directory (``data.json``).

    ``content`` decides whether two datasets are the same: the file's SHA-256
    for HDF5 files and the demo (the one the dataset cache computed), else the
    dataset's fingerprint. The file's size and modification time, where there
    is a file, are only for messages.
    """
    record = {
        "source": info.source,
        "name": info.name,
        "fingerprint": info.fingerprint,
        "content": info.sha256 or info.fingerprint,
        "num_transitions": info.num_transitions,
    }
    path = DEMO_DATASET_PATH if info.source_kind == "demo" else Path(info.source).expanduser()
    if info.source_kind in ("hdf5", "demo") and path.is_file():
        stat = path.stat()
        record.update(
            path=str(path.resolve()),
            size_bytes=stat.st_size,
            modified=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stat.st_mtime)),
        )
    return record
