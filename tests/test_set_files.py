"""The benchmark sets' files (benchmarks/set_files.py): the repository's copies and the cache."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import BenchmarkInputError, set_files  # noqa: E402

NAME = "walker2d-medium-replay-gen"


def record(path: Path, payload: bytes, recorded: str | None = None) -> str:
    """A provenance file at ``path`` recording ``payload``'s sha256 (or ``recorded``)."""
    sha = hashlib.sha256(payload).hexdigest()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sha256": recorded or sha, "command": "python scripts/collect.py"}))
    return sha


@pytest.fixture
def repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A git repository standing for the project's: ``keep(payload)`` stores ``payload`` as a
    blob of its history and lists it in its ``copies.json`` as walker2d's copy."""
    root = tmp_path / "repository"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.setattr(set_files, "ROOT", root)
    monkeypatch.setattr(set_files, "COPIES", root / "benchmarks" / "data" / "copies.json")

    def keep(payload: bytes, recorded: str | None = None, blob: str | None = None) -> str:
        source = tmp_path / "payload"
        source.write_bytes(payload)
        written = subprocess.run(
            ["git", "-C", str(root), "hash-object", "-w", str(source)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        provenance = f"benchmarks/data/{NAME}.provenance.json"
        sha = record(root / provenance, payload, recorded)
        entry = {"blob": blob or written, "sha256": sha, "provenance": provenance}
        set_files.COPIES.write_text(json.dumps({"sets": {NAME: entry}}))
        return sha

    return keep


def cached(cache: Path, payload: bytes) -> tuple[Path, str]:
    path = cache / "generated" / f"{NAME}.hdf5"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path, record(path.with_suffix(".provenance.json"), payload)


def test_the_history_copy_goes_into_an_empty_cache(isolated_cache: Path, repository) -> None:
    sha = repository(b"the repository's file")
    path = set_files.ensure_dataset(NAME)
    assert path == isolated_cache / "generated" / f"{NAME}.hdf5"
    assert path.read_bytes() == b"the repository's file"
    assert set_files.recorded_sha256(path) == sha
    assert set_files.dataset_provenance(NAME)["sha256"] == sha
    assert not list(path.parent.glob(".*partial"))


def test_a_cached_file_of_another_sha_is_moved_aside(isolated_cache: Path, repository) -> None:
    sha = repository(b"the repository's file")
    path, old_sha = cached(isolated_cache, b"made on another CPU")
    set_files.ensure_dataset(NAME)
    assert path.read_bytes() == b"the repository's file"
    assert set_files.recorded_sha256(path) == sha
    kept = path.with_name(f"{NAME}.{old_sha[:12]}.hdf5")
    assert kept.read_bytes() == b"made on another CPU"
    assert set_files.recorded_sha256(kept) == old_sha


def test_a_copy_unlike_its_record_is_refused(isolated_cache: Path, repository) -> None:
    repository(b"changed", recorded="0" * 64)
    with pytest.raises(BenchmarkInputError, match="was changed.*git checkout -- benchmarks/data"):
        set_files.ensure_dataset(NAME)
    generated = isolated_cache / "generated"
    assert not list(generated.glob("*.hdf5")) and not list(generated.glob(".*partial"))


def test_a_clone_without_the_history_reads_the_cached_file(
    isolated_cache: Path, repository
) -> None:
    repository(b"the repository's file", blob="1" * 40)  # not in this clone's objects
    assert set_files.committed_copy(NAME) is None
    path, sha = cached(isolated_cache, b"made here")
    assert set_files.ensure_dataset(NAME) == path
    assert path.read_bytes() == b"made here"
    assert set_files.dataset_provenance(NAME)["sha256"] == sha


def test_a_machine_without_git_reads_the_cached_file(
    isolated_cache: Path, repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository(b"the repository's file")

    def no_git(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "git")

    monkeypatch.setattr(set_files, "git", no_git)
    assert set_files.committed_copy(NAME) is None
    path, sha = cached(isolated_cache, b"made here")
    assert set_files.ensure_dataset(NAME) == path
    assert set_files.recorded_sha256(path) == sha


def test_a_set_the_generator_cannot_make_is_refused_in_a_sentence(
    isolated_cache: Path, repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        set_files.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 2)
    )
    with pytest.raises(BenchmarkInputError, match=r"did not write .*exit code 2.*a kind it makes"):
        set_files.ensure_dataset("nosuch-medium-replay-gen")


def test_bad_input_ends_in_its_sentence_on_stderr_with_exit_code_2(
    isolated_cache: Path, repository, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(
        set_files.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 2)
    )
    with pytest.raises(SystemExit) as ended:
        set_files.run_main(lambda: set_files.main(["nosuch-medium-replay-gen"]))
    assert ended.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("error: the generator did not write") and "Traceback" not in message


def test_copies_only_installs_a_copy_and_never_runs_the_generator(
    isolated_cache: Path, repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = subprocess.run

    def no_generator(command, *args, **kwargs):
        assert command[0] == "git", f"the generator ran: {command}"
        return run(command, *args, **kwargs)

    monkeypatch.setattr(set_files.subprocess, "run", no_generator)
    repository(b"the repository's file")
    assert set_files.main(["--copies-only", NAME]) == 0
    assert (isolated_cache / "generated" / f"{NAME}.hdf5").read_bytes() == b"the repository's file"
    with pytest.raises(set_files.BenchmarkInputError, match="keeps no copy of nosuch-medium"):
        set_files.main(["--copies-only", "nosuch-medium-replay-gen"])


def test_the_listed_copies_match_their_provenance_files() -> None:
    listing = json.loads(set_files.COPIES.read_text())
    assert listing["format"] == set_files.COPIES_FORMAT
    for name, entry in listing["sets"].items():
        provenance = json.loads((ROOT / entry["provenance"]).read_text())
        assert provenance["sha256"] == entry["sha256"], name
        assert provenance["size_bytes"] == entry["bytes"], name
        assert provenance["file"] == f"{name}.hdf5"
    demo = set_files.committed_copy("hopper-medium-replay-gen")
    assert set_files.file_sha256(demo.path) == set_files.copy_sha256(demo)
