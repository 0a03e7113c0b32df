"""The benchmark sets' files: the repository's copies, and the cache that runs read.

A run reads ``<cache>/generated/<name>.hdf5`` (``$CBOP_TORCHRL_CACHE``, default
``~/.cache/cbop_torchrl``). Where the repository keeps a copy of the set
(:func:`committed_copy`), that copy is the benchmark's file: it is put into the cache when
the cache has none, and it replaces a cached file of another sha256, which is moved aside
(``<name>.<sha12>.hdf5``), not deleted. Otherwise the generator makes the file
(``benchmarks/make_datasets.sh``).

The copies are kept because the generator's SAC run is bit-reproducible on one CPU kind
only: the same command on a CPU with other vector units trains another behaviour policy and
writes another file (docs/datasets.md). Hopper's copy is the package's demo file. The
others are git blobs in the repository's history, listed in ``benchmarks/data/copies.json``
beside their provenance files: kept out of the working tree, which a GPU machine takes
only up to 64 MiB (docs/gpu.md). A clone without that history (``git clone --depth 1``, an
archive) has no copy and falls back to the generator.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/set_files.py` puts benchmarks/, not the root

from benchmarks import BenchmarkInputError, run_main  # noqa: E402
from cbop_torchrl.data.sources import DEMO_DATASET_PATH  # noqa: E402
from cbop_torchrl.io import cache_dir  # noqa: E402

COPIES = ROOT / "benchmarks" / "data" / "copies.json"
"""``sets``: name -> ``blob`` (git object id), ``sha256``, ``bytes`` and ``provenance``
(its provenance file, relative to the repository root)."""
COPIES_FORMAT = "cbop-torchrl-set-copies/1"
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


class Copy(NamedTuple):
    """The repository's copy of a set: a file in the tree, or a git blob in its history."""

    provenance: Path
    path: Path | None = None
    blob: str | None = None


def dataset_path(name: str) -> Path:
    """Where runs read ``name`` (``<cache>/generated/<name>.hdf5``)."""
    return cache_dir("generated") / f"{name}.hdf5"


def provenance_path(data: Path) -> Path:
    """The generator's record beside a data file (``<name>.provenance.json``)."""
    return data.with_suffix(".provenance.json")


def git(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """``git -C ROOT args``, not raising (the caller reads ``returncode``)."""
    return subprocess.run(["git", "-C", str(ROOT), *args], check=False, **kwargs)


def history_copies() -> dict[str, dict]:
    """``benchmarks/data/copies.json``'s sets (``{}`` without the file)."""
    if not COPIES.is_file():
        return {}
    return json.loads(COPIES.read_text())["sets"]


def committed_copy(name: str) -> Copy | None:
    """The repository's copy of ``name`` (None: it keeps none, or this clone lacks it)."""
    if name in DEMO_COPIES:
        path = DEMO_COPIES[name]
        return Copy(provenance_path(path), path=path) if path.is_file() else None
    entry = history_copies().get(name)
    if entry is None:
        return None
    try:
        present = git("cat-file", "-e", f"{entry['blob']}^{{blob}}", capture_output=True)
    except OSError:  # no git on this machine: as a clone without the history
        return None
    if present.returncode != 0:
        return None
    return Copy(ROOT / entry["provenance"], blob=entry["blob"])


def record_sha256(record: Path) -> str | None:
    """The sha256 a provenance file records (None: no such file)."""
    return json.loads(record.read_text()).get("sha256") if record.is_file() else None


def recorded_sha256(data: Path) -> str | None:
    """The sha256 the provenance file beside ``data`` records (None: no record)."""
    return record_sha256(provenance_path(data))


def copy_sha256(copy: Copy) -> str | None:
    """The sha256 the copy's provenance file records."""
    return record_sha256(copy.provenance)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_copy(copy: Copy, target: Path) -> None:
    """The copy's bytes at ``target`` (from the tree, or from the git history)."""
    if copy.path is not None:
        shutil.copyfile(copy.path, target)
        return
    with target.open("wb") as handle:
        git("cat-file", "blob", str(copy.blob), stdout=handle)


def install_copy(copy: Copy, data: Path) -> None:
    """Puts the repository's file and its provenance at ``data``, each written atomically.

    Raises:
        BenchmarkInputError: the copy's bytes are not the file its provenance records.
    """
    expected = copy_sha256(copy)
    data.parent.mkdir(parents=True, exist_ok=True)
    partial = data.with_name(f".{data.name}.partial")
    write_copy(copy, partial)
    actual = file_sha256(partial)
    if actual != expected:
        partial.unlink()
        raise BenchmarkInputError(
            f"the repository's copy of {data.name} has sha256 {actual[:12]}, but its "
            f"provenance file {copy.provenance} records {str(expected)[:12]}: the copy or its "
            "record was changed. Restore both with `git checkout -- benchmarks/data "
            "cbop_torchrl/assets` in the repository."
        )
    if data.is_file() and recorded_sha256(data) != expected:
        kept = data.with_name(f"{data.stem}.{str(recorded_sha256(data))[:12]}.hdf5")
        data.replace(kept)
        if provenance_path(data).is_file():
            provenance_path(data).replace(provenance_path(kept))
        print(f"[bench] moved    the cached {data.name} of another sha256 aside to {kept}")
    os.replace(partial, data)
    record = provenance_path(data).with_name(f".{provenance_path(data).name}.partial")
    shutil.copyfile(copy.provenance, record)
    os.replace(record, provenance_path(data))
    print(f"[bench] copied   the repository's {data.name} (sha256 {expected[:12]}) to {data}")


def ensure_dataset(name: str) -> Path:
    """The cached file of ``name``: the repository's copy where it keeps one, else generated.

    A cached file whose recorded sha256 differs from the repository's copy is moved aside
    and replaced; without a copy, a missing file is made by ``benchmarks/make_datasets.sh``
    (deterministic on one CPU kind).
    """
    path = dataset_path(name)
    copy = committed_copy(name)
    if copy is not None:
        if not path.is_file() or recorded_sha256(path) != copy_sha256(copy):
            path.parent.mkdir(parents=True, exist_ok=True)
            # Runs started side by side on an empty cache install the copy once.
            with (path.parent / f".{path.name}.lock").open("w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not path.is_file() or recorded_sha256(path) != copy_sha256(copy):
                    install_copy(copy, path)
        return path
    if path.is_file():
        return path
    family = name.split("-", 1)[0]
    print(f"[bench] {path} is missing: generating it (benchmarks/make_datasets.sh)", flush=True)
    env = {**os.environ, "FAMILIES": family, "PYTHON": sys.executable}
    made = subprocess.run(["bash", str(ROOT / "benchmarks" / "make_datasets.sh")], env=env)
    if made.returncode != 0 or not path.is_file():
        raise BenchmarkInputError(
            f"the generator did not write {path} (exit code {made.returncode}; its "
            f"message is above); is {name!r} a kind it makes "
            "(hopper|walker2d|halfcheetah)-(medium|medium-replay)-gen?"
        )
    return path


def dataset_provenance(name: str) -> dict:
    """What the generator recorded about the set's file (its ``PROVENANCE_KEYS``), or ``{}``.

    The repository's copy answers for a set it keeps (the file runs will read), else the
    cached file's record.
    """
    copy = committed_copy(name)
    path = copy.provenance if copy is not None else provenance_path(dataset_path(name))
    if not path.is_file():
        return {}
    values = json.loads(path.read_text())
    return {key: values.get(key) for key in PROVENANCE_KEYS}


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/set_files.py NAME [NAME ...]``: each set's file into the cache."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("names", nargs="+", help="benchmark sets, e.g. walker2d-medium-replay-gen")
    parser.add_argument(
        "--copies-only",
        action="store_true",
        help="never run the generator: a set without a readable repository copy is an error",
    )
    args = parser.parse_args(argv)
    for name in args.names:
        if args.copies_only and committed_copy(name) is None:
            raise BenchmarkInputError(
                f"the repository keeps no copy of {name} that this checkout can read (a bundled "
                f"file, or a git blob of its history: {COPIES.relative_to(ROOT)}); put the "
                f"file in the cache's generated/ yourself, or run `python "
                f"benchmarks/set_files.py {name}` to generate it"
            )
        path = ensure_dataset(name)
        print(f"{name}: {path} (sha256 {str(recorded_sha256(path))[:12]})")
    return 0


if __name__ == "__main__":
    run_main(main)
