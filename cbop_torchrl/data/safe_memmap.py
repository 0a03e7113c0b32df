"""A TensorDict memmap directory (TorchRL's D4RL and Minari caches) checked to hold tensors only.

``TensorDict.load_memmap`` rebuilds what a directory's ``meta.json`` files describe: plain
tensors, but also ``NonTensorData`` fields, whose value it unpickles from an
``other.pickle`` file, and tensorclasses named by their import path. A cache directory
is an input like any file, so before TorchRL is let to load one
(:func:`check_tensors_only`) every file in it is checked from its name and its JSON
only, without unpickling or importing anything: each folder is a plain ``TensorDict``
node, each leaf a memory-mapped tensor of a numeric dtype, and nothing else (no pickle,
no link, no other class) is there.
"""

from __future__ import annotations

import json
from pathlib import Path

from cbop_torchrl.data.errors import DatasetError

_TENSORDICT_TYPE = "<class 'tensordict._td.TensorDict'>"
_NUMERIC_DTYPES = frozenset(
    f"torch.{name}"
    for name in (
        "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
        "uint8", "bool",
    )
)  # fmt: skip
_NODE_KEYS = frozenset(("shape", "device", "_type", "_metadata", "_is_non_tensor"))


def check_tensors_only(
    directory: str | Path, what: str, remedy: str, extra_files: tuple[str, ...] = ()
) -> None:
    """Refuses a memmap directory that holds anything but plain tensors.

    Args:
        directory: the folder ``TensorDict.load_memmap`` would read (or a folder above it).
        what: what the folder is, for the message ("TorchRL's cache of 'hopper-medium-v2'").
        remedy: what to do instead (delete the folder, load the raw file, ...).
        extra_files: other plain files the folder may hold at its top (read by JSON only,
            e.g. Minari's ``env_metadata.json``).

    Raises:
        DatasetError: naming the first file or entry that is not a plain tensor.
    """
    root = Path(directory)

    def refuse(why: str) -> DatasetError:
        return DatasetError(
            f"{what} at {str(root)!r} holds {why}, which loading it would unpickle or import "
            "(code could run); only tensors are read from a cache, so it is not loaded. "
            f"{remedy}"
        )

    if root.is_symlink():
        raise refuse(f"a link ({str(root)!r})")
    for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if folder.is_symlink():
            raise refuse(f"a link ({str(folder)!r})")
        names = {entry.name for entry in folder.iterdir()}
        leaves: set[str] = set()
        children: set[str] = set()
        if "meta.json" in names:
            leaves, children = _check_node(folder / "meta.json", refuse)
        for entry in folder.iterdir():
            if entry.is_symlink():
                raise refuse(f"a link ({str(entry)!r})")
            if entry.is_dir():
                if entry.name not in children and "meta.json" in names:
                    raise refuse(f"a folder its meta.json does not name ({str(entry)!r})")
                continue
            allowed = (
                entry.name == "meta.json"
                or (entry.suffix == ".memmap" and entry.stem in leaves)
                or (folder == root and entry.name in extra_files)
            )
            if not allowed or not entry.is_file():
                raise refuse(f"a file that is not a tensor ({str(entry)!r})")


def _check_node(meta: Path, refuse) -> tuple[set[str], set[str]]:  # noqa: ANN001
    """The leaf and child names a node's ``meta.json`` lists, each checked to be a tensor
    of a numeric dtype or a plain ``TensorDict``."""
    if meta.is_symlink() or not meta.is_file():
        raise refuse(f"a meta.json that is not a regular file ({str(meta)!r})")
    try:
        node = json.loads(meta.read_text())
    except (OSError, ValueError):
        raise refuse(f"an unreadable meta.json ({str(meta)!r})") from None
    if not isinstance(node, dict) or node.get("_type") != _TENSORDICT_TYPE:
        kind = node.get("_type") if isinstance(node, dict) else type(node).__name__
        raise refuse(f"an entry of type {kind!r} ({str(meta)!r}), not a plain TensorDict")
    if node.get("_is_non_tensor") or node.get("_metadata") not in (None, {}):
        raise refuse(f"non-tensor data ({str(meta)!r})")
    leaves, children = set(), set()
    for key, entry in node.items():
        if key in _NODE_KEYS:
            continue
        if not isinstance(entry, dict):
            raise refuse(f"an entry {key!r} that is not a tensor ({str(meta)!r})")
        if "dtype" in entry:
            if entry["dtype"] not in _NUMERIC_DTYPES or entry.get("is_nested"):
                raise refuse(f"the field {key!r} of dtype {entry['dtype']!r} ({str(meta)!r})")
            leaves.add(key)
        elif entry.get("type") == "TensorDict":
            children.add(key)
        else:
            raise refuse(
                f"the field {key!r} of type {entry.get('type')!r} ({str(meta)!r}), not a tensor"
            )
    return leaves, children
