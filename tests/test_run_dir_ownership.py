"""A run only touches files it made, and links never redirect a write.

The end-to-end cases run ``cbop-train`` at the debug preset in a folder that is not a run,
in this process (tests/refusals.py); each is refused before any data is loaded.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from d4rl_files import debug_cbop_command, pipeline_workspace, write_d4rl_hdf5
from refusals import run_one
from tensordict import NonTensorData, TensorDict

from cbop_torchrl.data import DatasetError
from cbop_torchrl.data.hdf5 import convert_hdf5, load_hdf5
from cbop_torchrl.io import cache_dir
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.trainers.rundir import (
    LOCK_NAME,
    MARKER_NAME,
    RunLock,
    claim_run_dir,
    clear_previous_run,
)


def user_folder(root: Path) -> dict[Path, str]:
    """A folder of a user's own files, some named like a run's outputs; returns path -> text."""
    files = {
        root / "logs" / "sub" / "important.txt": "keep me\n",
        root / "config.json": '{"mine": true}\n',
        root / "results.json": '{"also": "mine"}\n',
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


RESUMES = ["false", "auto"]


@pytest.fixture(scope="module")
def refused_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """resume -> (run, the folder, its files): each command from its workspace's folder."""
    refused = {}
    for resume in RESUMES:
        root = tmp_path_factory.mktemp(f"resume_{resume}")
        workspace = pipeline_workspace(root)
        folder = root / "my_folder"
        files = user_folder(folder)
        _, script, *args = debug_cbop_command(workspace, folder, f"resume={resume}")
        refused[resume] = run_one(Path(script).name, args, root, workspace["env"]), folder, files
    return refused


@pytest.mark.parametrize("resume", RESUMES)
def test_a_folder_that_is_not_a_run_is_refused_and_left_as_it_was(
    refused_folders: dict[str, tuple], resume: str
) -> None:
    done, folder, files = refused_folders[resume]
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "no cbop-torchrl run wrote there" in error[0], done.stderr
    assert "hydra.run.dir=" in error[0] and "config.json" in error[0], error
    for path, text in files.items():
        assert path.read_text() == text, path
    assert not (folder / LOCK_NAME).exists() and not (folder / MARKER_NAME).exists()


def test_a_run_marks_its_directory_and_only_a_marked_one_is_a_run(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    claim_run_dir(fresh)  # an empty folder (as Hydra makes it: it writes nothing there)
    assert (fresh / MARKER_NAME).is_file()
    other_app = tmp_path / "other_app"  # another Hydra application's record and log
    (other_app / ".hydra").mkdir(parents=True)
    (other_app / ".hydra" / "config.yaml").write_text("theirs: 1\n")
    (other_app / "my_app.log").write_text("")
    with pytest.raises(CheckpointError, match=r"no cbop-torchrl run wrote there \(.hydra, my_"):
        claim_run_dir(other_app)
    assert sorted(p.name for p in other_app.iterdir()) == [".hydra", "my_app.log"]
    assert (other_app / ".hydra" / "config.yaml").read_text() == "theirs: 1\n"
    claim_run_dir(tmp_path / "new" / "nested")
    assert (tmp_path / "new" / "nested" / MARKER_NAME).is_file()
    previous_run = tmp_path / "marked"
    user_folder(previous_run)
    (previous_run / MARKER_NAME).write_text("")
    claim_run_dir(previous_run)
    assert clear_previous_run(previous_run) == ["results.json", "config.json", "logs"]
    locked_only = tmp_path / "locked"  # a stray lock file proves nothing
    files = user_folder(locked_only)
    (locked_only / LOCK_NAME).write_text("")
    with pytest.raises(CheckpointError, match="no cbop-torchrl run wrote there"):
        claim_run_dir(locked_only)
    assert all(path.read_text() == text for path, text in files.items())
    assert not (locked_only / MARKER_NAME).exists()
    marked_by_link = tmp_path / "linked"
    user_folder(marked_by_link)
    (marked_by_link / MARKER_NAME).symlink_to(fresh / MARKER_NAME)
    with pytest.raises(CheckpointError, match="no cbop-torchrl run wrote there"):
        claim_run_dir(marked_by_link)


def test_clear_previous_run_refuses_an_unmarked_folder(tmp_path: Path) -> None:
    files = user_folder(tmp_path)
    with pytest.raises(CheckpointError, match="not marked as a cbop-torchrl run"):
        clear_previous_run(tmp_path)
    assert all(path.read_text() == text for path, text in files.items())
    with pytest.raises(CheckpointError, match="not a directory"):
        claim_run_dir(tmp_path / "config.json")


def test_clear_previous_run_removes_a_link_not_its_target(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    files = user_folder(elsewhere)
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir)
    (run_dir / "logs").symlink_to(elsewhere / "logs")
    (run_dir / "results.json").symlink_to(elsewhere / "results.json")
    assert clear_previous_run(run_dir) == ["results.json", "logs"]
    assert all(path.read_text() == text for path, text in files.items())


def test_the_run_lock_never_follows_a_link_or_empties_its_target(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_NAME).symlink_to(target)
    with pytest.raises(CheckpointError, match="not a link"):
        RunLock(run_dir)
    assert target.read_text() == "precious\n"
    (run_dir / LOCK_NAME).unlink()
    (run_dir / LOCK_NAME).mkdir()
    with pytest.raises(CheckpointError, match="run lock"):
        RunLock(run_dir)


class _RunsCodeWhenUnpickled:
    """Unpickling this touches ``path``: what a hostile cache entry could do instead."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (Path.touch, (self.path,))


def test_a_dataset_cache_entry_is_read_without_pickle_and_checked(tmp_path: Path) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(6, 5, 4))
    first, info = load_hdf5(file)
    expected, _, _ = convert_hdf5(file)
    again, _ = load_hdf5(file)  # from the cache
    for data in (first, again):
        assert set(data.keys(True, True)) == set(expected.keys(True, True))
        assert all(torch.equal(data[key], expected[key]) for key in expected.keys(True, True))
    entry = cache_dir("datasets") / info["fingerprint"]

    manifest_path = entry / "data" / "leaves.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["leaves"][0]["dtype"] = "object"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="dtype 'object'.*delete that directory"):
        load_hdf5(file)

    # A TensorDict memmap holding a pickled object, as a hostile entry would.
    sentinel = tmp_path / "code_ran"
    shutil.rmtree(entry / "data")
    hostile = TensorDict(
        {
            "observation": expected["observation"],
            "evil": NonTensorData(_RunsCodeWhenUnpickled(sentinel), batch_size=expected.shape),
        },
        batch_size=expected.shape,
    )
    hostile.memmap_(entry / "data")
    with pytest.raises(DatasetError, match="not written by cbop-torchrl"):
        load_hdf5(file)
    assert not sentinel.exists()


def test_an_unmarked_run_of_an_earlier_version_is_adopted_only_once_marked(tmp_path):
    """Lock + a checkpoint this package reads + only a run's outputs: refused until its user
    marks it (the marker alone decides, never what a folder holds); the same with a user's
    file beside them is refused, the file untouched."""
    from cbop_torchrl.trainers.checkpoint import CHECKPOINT_FORMAT, CheckpointError
    from cbop_torchrl.trainers.rundir import MARKER_NAME, claim_run_dir

    def earlier_run(path):
        path.mkdir()
        (path / ".run.lock").write_text("")
        torch.save({"format": CHECKPOINT_FORMAT, "step": 10}, path / "checkpoint.pt")
        (path / "logs").mkdir()
        return path

    adopted = earlier_run(tmp_path / "earlier")
    with pytest.raises(CheckpointError, match="touch .*earlier/.cbop-run") as error:
        claim_run_dir(adopted)
    assert not (adopted / MARKER_NAME).exists()
    os.system(str(error.value).rpartition("mark it: ")[2].partition(", then")[0])  # as written
    claim_run_dir(adopted)
    assert (adopted / MARKER_NAME).is_file()

    mixed = earlier_run(tmp_path / "mixed")
    (mixed / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="no .cbop-run marker"):
        claim_run_dir(mixed)
    assert (mixed / "notes.txt").read_text() == "mine" and not (mixed / MARKER_NAME).exists()

    not_ours = tmp_path / "not-ours"
    not_ours.mkdir()
    (not_ours / ".run.lock").write_text("")
    (not_ours / "checkpoint.pt").write_bytes(b"a user's own file")
    with pytest.raises(CheckpointError, match="no .cbop-run marker"):
        claim_run_dir(not_ours)
