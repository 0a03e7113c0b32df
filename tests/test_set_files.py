"""The benchmark sets' files (benchmarks/set_files.py): the repository's copies and the cache."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import set_files  # noqa: E402

NAME = "walker2d-medium-replay-gen"


def write_set(path: Path, payload: bytes, recorded: str | None = None) -> str:
    """A stand-in data file and its provenance (which records ``recorded``, default its sha)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    record = {"sha256": recorded or sha, "command": "python scripts/collect.py env=walker2d"}
    path.with_suffix(".provenance.json").write_text(json.dumps(record))
    return sha


@pytest.fixture
def committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "committed"
    monkeypatch.setattr(set_files, "COMMITTED_DIR", directory)
    return directory


def test_copy_goes_into_an_empty_cache(isolated_cache: Path, committed: Path) -> None:
    sha = write_set(committed / f"{NAME}.hdf5", b"new file")
    path = set_files.ensure_dataset(NAME)
    assert path == isolated_cache / "generated" / f"{NAME}.hdf5"
    assert path.read_bytes() == b"new file"
    assert set_files.recorded_sha256(path) == sha
    assert set_files.dataset_provenance(NAME)["sha256"] == sha


def test_cached_file_of_another_sha_is_moved_aside(isolated_cache: Path, committed: Path) -> None:
    sha = write_set(committed / f"{NAME}.hdf5", b"new file")
    cached = isolated_cache / "generated" / f"{NAME}.hdf5"
    old_sha = write_set(cached, b"old file")
    set_files.ensure_dataset(NAME)
    assert cached.read_bytes() == b"new file" and set_files.recorded_sha256(cached) == sha
    kept = cached.with_name(f"{NAME}.{old_sha[:12]}.hdf5")
    assert kept.read_bytes() == b"old file"
    assert set_files.recorded_sha256(kept) == old_sha


def test_damaged_copy_is_refused(isolated_cache: Path, committed: Path) -> None:
    write_set(committed / f"{NAME}.hdf5", b"damaged", recorded="0" * 64)
    with pytest.raises(SystemExit, match="damaged.*git checkout -- "):
        set_files.ensure_dataset(NAME)
    assert not (isolated_cache / "generated" / f"{NAME}.hdf5").exists()


def test_without_a_copy_the_cached_file_is_used(isolated_cache: Path, committed: Path) -> None:
    cached = isolated_cache / "generated" / f"{NAME}.hdf5"
    sha = write_set(cached, b"made here")
    assert set_files.committed_copy(NAME) is None
    assert set_files.ensure_dataset(NAME) == cached
    assert set_files.dataset_provenance(NAME)["sha256"] == sha


def test_repository_copies_are_the_files_their_provenance_records() -> None:
    names = [p.stem for p in set_files.COMMITTED_DIR.glob("*.hdf5")]
    names += list(set_files.DEMO_COPIES)
    for name in names:
        copy = set_files.committed_copy(name)
        assert copy is not None, f"{name}: no provenance beside its copy"
        assert set_files.file_sha256(copy) == set_files.recorded_sha256(copy), name
