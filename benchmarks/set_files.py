"""The benchmark sets' files: the copies kept in the repository, and the cache that runs read.

A run reads ``<cache>/generated/<name>.hdf5`` (``$CBOP_TORCHRL_CACHE``, default
``~/.cache/cbop_torchrl``). Where the repository keeps a copy of the set
(:func:`committed_copy`), that copy is the benchmark's file: it is put into the cache
when the cache has none, and it replaces a cached file of another sha256, which is moved
aside (``<name>.<sha12>.hdf5``), not deleted. Otherwise the generator makes the file
(``benchmarks/make_datasets.sh``).

The copies are kept because the generator's SAC run is bit-reproducible on one CPU kind
only: the same command on a CPU with other vector units (AVX-512 with or without AMX,
AVX2) trains another behaviour policy and writes another file (docs/datasets.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cbop_torchrl.data.sources import DEMO_DATASET_PATH
from cbop_torchrl.io import cache_dir

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_DIR = ROOT / "benchmarks" / "data"
"""The repository's copies of the benchmark sets: ``<name>.hdf5`` and ``<name>.provenance.json``."""
DEMO_COPIES = {
    # The package's demo file is this set (the same generator settings, data_key 695feec0a915).
    "hopper-medium-replay-gen": DEMO_DATASET_PATH,
}
"""Sets whose repository copy is a file bundled with the package."""
PROVENANCE_KEYS = (
    "command",
    "data_key",
    "sha256",
    "transitions",
    "episodes",
    "episode_normalized_score_mean",
    "policy_normalized_score",
    "sac_total_steps",
)


def dataset_path(name: str) -> Path:
    """Where runs read ``name`` (``<cache>/generated/<name>.hdf5``)."""
    return cache_dir("generated") / f"{name}.hdf5"


def provenance_path(data: Path) -> Path:
    """The generator's record beside a data file (``<name>.provenance.json``)."""
    return data.with_suffix(".provenance.json")


def committed_copy(name: str) -> Path | None:
    """The repository's copy of ``name`` (None: the repository keeps none)."""
    path = DEMO_COPIES.get(name, COMMITTED_DIR / f"{name}.hdf5")
    return path if path.is_file() and provenance_path(path).is_file() else None


def recorded_sha256(data: Path) -> str | None:
    """The sha256 the provenance file beside ``data`` records (None: no record)."""
    path = provenance_path(data)
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("sha256")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_copy(copy: Path, data: Path) -> None:
    """Copies the repository's file and its provenance to ``data``, each written atomically.

    Raises:
        SystemExit: the copy's bytes are not the file its provenance records.
    """
    expected = recorded_sha256(copy)
    actual = file_sha256(copy)
    if actual != expected:
        shown = copy.relative_to(ROOT) if copy.is_relative_to(ROOT) else copy
        raise SystemExit(
            f"error: {copy} has sha256 {actual[:12]}, but its provenance file records "
            f"{str(expected)[:12]}: the copy is damaged. Restore it with "
            f"`git checkout -- {shown}` in the repository."
        )
    data.parent.mkdir(parents=True, exist_ok=True)
    if data.is_file() and recorded_sha256(data) != expected:
        kept = data.with_name(f"{data.stem}.{str(recorded_sha256(data))[:12]}.hdf5")
        data.replace(kept)
        if provenance_path(data).is_file():
            provenance_path(data).replace(provenance_path(kept))
        print(f"[bench] moved    the cached {data.name} of another sha256 aside to {kept}")
    for source, target in ((copy, data), (provenance_path(copy), provenance_path(data))):
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(source, partial)
        os.replace(partial, target)
    print(f"[bench] copied   the repository's {copy.name} (sha256 {expected[:12]}) to {data}")


def ensure_dataset(name: str) -> Path:
    """The cached file of ``name``: the repository's copy where it keeps one, else generated.

    A cached file whose recorded sha256 differs from the repository's copy is moved aside
    and replaced; without a copy, a missing file is made by ``benchmarks/make_datasets.sh``
    (deterministic on one CPU kind).
    """
    path = dataset_path(name)
    copy = committed_copy(name)
    if copy is not None:
        if not path.is_file() or recorded_sha256(path) != recorded_sha256(copy):
            install_copy(copy, path)
        return path
    if path.is_file():
        return path
    family = name.split("-", 1)[0]
    print(f"[bench] {path} is missing: generating it (benchmarks/make_datasets.sh)", flush=True)
    env = {**os.environ, "FAMILIES": family, "PYTHON": sys.executable}
    subprocess.run(["bash", str(ROOT / "benchmarks" / "make_datasets.sh")], env=env, check=True)
    if not path.is_file():
        raise SystemExit(
            f"error: the generator did not write {path}; is {name!r} a kind it makes "
            "(hopper|walker2d|halfcheetah)-(medium|medium-replay)-gen?"
        )
    return path


def dataset_provenance(name: str) -> dict:
    """What the generator recorded about the set's file (its ``PROVENANCE_KEYS``), or ``{}``.

    The repository's copy answers for a set it keeps (the file runs will read), else the
    cached file's record.
    """
    copy = committed_copy(name)
    path = provenance_path(copy if copy is not None else dataset_path(name))
    if not path.is_file():
        return {}
    values = json.loads(path.read_text())
    return {key: values.get(key) for key in PROVENANCE_KEYS}
