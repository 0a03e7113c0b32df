"""The files the refusal batteries (tests/test_refusals_cbop_*.py) give the programs.

:func:`write_inputs` writes all of them under one folder (small D4RL-format files, FIFOs,
links, a user's files named like a program's outputs, hostile configs) and returns their
paths by name; each program's test file builds its cases from them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import torch
from d4rl_files import write_d4rl_hdf5

from cbop_torchrl.io import OUTPUTS_MANIFEST
from cbop_torchrl.trainers.checkpoint import seal
from cbop_torchrl.trainers.rundir import LOCK_NAME

COLLECT = ["env=hopper", "kind=random", "rollout_transitions=2000", "progress=false"]
DEBUG = ["preset=debug", "progress=false"]
ON_DATA = [*DEBUG, "estimator.psi=1"]  # the files' names give no dataset kind: psi given
UNSET = "CBOP_TEST_SURELY_UNSET_VARIABLE"
UNCHAINED = "the observation of the next row is not this row's next observation"


def kept(*paths: Path) -> dict[Path, bytes]:
    """``path -> its bytes now`` (what a case must leave as it is)."""
    return {path: path.read_bytes() for path in paths}


def _replace(path: Path, key: str, **create) -> Path:  # noqa: ANN003
    """``path`` with ``key`` rewritten by ``h5py.create_dataset(**create)`` of its values."""
    with h5py.File(path, "a") as handle:
        values = handle[key][()]
        del handle[key]
        dtype = create.pop("dtype", values.dtype)
        handle.create_dataset(key, data=values.astype(dtype), **create)
    return path


def _edit_file(source: Path, path: Path, edit) -> Path:  # noqa: ANN001
    """A copy of the D4RL-format ``source`` at ``path``, changed by ``edit(handle)``."""
    shutil.copy(source, path)
    with h5py.File(path, "a") as handle:
        edit(handle)
    return path


def _as_group(key: str):  # noqa: ANN202
    def edit(handle: h5py.File) -> None:
        values = handle[key][()]
        del handle[key]
        handle.create_group(key)["values"] = values

    return edit


def _scaled(key: str, factor: float):  # noqa: ANN202
    def edit(handle: h5py.File) -> None:
        values = handle[key][()].astype(np.float64) * factor
        del handle[key]
        handle[key] = values

    return edit


def _linked(key: str, target: str, virtual: bool = False):  # noqa: ANN202
    def edit(handle: h5py.File) -> None:
        shape = handle[key].shape
        del handle[key]
        if virtual:
            layout = h5py.VirtualLayout(shape=shape, dtype="f4")
            layout[...] = h5py.VirtualSource(target, "values", shape=shape)
            handle.create_virtual_dataset(key, layout)
        else:
            handle[key] = h5py.ExternalLink(target, "/values")

    return edit


def user_run_like_folder(folder: Path) -> dict[Path, bytes]:
    """A user's folder with an empty ``.run.lock`` and files named like a run's outputs."""
    files = {
        folder / "logs" / "2024-notes.txt": b"my notes\n",
        folder / "config.json": b'{"mine": true}\n',
        folder / "results.json": b'{"also": "mine"}\n',
        folder / LOCK_NAME: b"",
    }
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return files


def unwritable_dir(root: Path) -> tuple[Path, Path]:
    """A directory this process cannot create, and the part of its path that blocks it.

    A read-only (0o555) directory for a regular user; root writes into one
    regardless, so for root the blocking part is a regular file instead.
    """
    if os.geteuid() != 0:
        blocked = root / "read_only"
        blocked.mkdir()
        blocked.chmod(0o555)
    else:
        blocked = root / "a_file"
        blocked.write_text("not a directory\n")
    return blocked / "run", blocked


def _damaged_datasets(root: Path) -> dict[str, Path]:
    """Hopper files whose arrays are stored in ways a program must refuse."""
    data = root / "data"

    def hopper(name: str) -> Path:
        return write_d4rl_hdf5(data / name, episode_lengths=(400, 400, 400))

    base = write_d4rl_hdf5(root / "hopper-base.hdf5", episode_lengths=(40, 40, 40))
    with h5py.File(root / "values.h5", "w") as handle:
        handle["values"] = np.zeros((120, 11), dtype=np.float32)

    def edited(name: str, edit) -> Path:  # noqa: ANN001
        return _edit_file(base, data / name, edit)

    loop = write_d4rl_hdf5(data / "hopper-loop.hdf5", episode_lengths=(40, 40, 40))
    with h5py.File(loop, "a") as handle:
        del handle["observations"]
        handle["observations"] = h5py.SoftLink("/loop_a")
        handle["loop_a"] = h5py.SoftLink("/loop_b")
        handle["loop_b"] = h5py.SoftLink("/loop_a")
    dangling = write_d4rl_hdf5(data / "hopper-dangling.hdf5", episode_lengths=(40, 40, 40))
    with h5py.File(dangling, "a") as handle:
        del handle["rewards"]
        handle["rewards"] = h5py.SoftLink("/nowhere")
    return {
        "base": base,
        "float16": _replace(hopper("hopper-f16.hdf5"), "observations", dtype=np.float16),
        "scaleoffset": _replace(hopper("hopper-so.hdf5"), "observations", scaleoffset=2),
        "next_f16": _replace(hopper("hopper-nf16.hdf5"), "next_observations", dtype=np.float16),
        "loop": loop,
        "dangling": dangling,
        "plain": hopper("hopper-plain.hdf5"),
        "rewards_group": edited("hopper-group.hdf5", _as_group("rewards")),
        "linked_missing": edited("hopper-link.hdf5", _linked("observations", "gone.h5")),
        "big_rewards": edited("hopper-big-r.hdf5", _scaled("rewards", 1e30)),
        "big_observations": edited("hopper-big-o.hdf5", _scaled("observations", 1e30)),
        "big_actions": edited("hopper-big-a.hdf5", _scaled("actions", 1e30)),
        "virtual_missing": edited(
            "hopper-vds.hdf5", _linked("observations", "vgone.h5", virtual=True)
        ),
        "one_row": write_d4rl_hdf5(
            root / "hopper-one.hdf5",
            episode_lengths=(1,),
            terminal_episodes=(),
            timeout_episodes=(),
        ),  # fmt: skip
    }


def _user_files(root: Path) -> SimpleNamespace:
    """Files and folders of a user's that programs must not replace, links and FIFOs."""
    data = root / "data"
    fifo = data / "fifo.hdf5"
    os.mkfifo(fifo)
    folder = data / "a-folder.hdf5"
    folder.mkdir()
    not_checkpoints = {
        "json": (data / "policy.json", b'{"actor": 1}\n', "a JSON file"),
        "csv": (data / "scores.csv", b"step,value\n1,2.0\n2,3.0\n", "a CSV file"),
        "text": (data / "notes.txt", b"my notes about the run\n", "a text file"),
    }
    for path, content, _ in not_checkpoints.values():
        path.write_bytes(content)
    # a report folder and a sweep holding FIFOs named like what the programs read
    fifo_report = root / "fifo_report"
    (fifo_report / "run").mkdir(parents=True)
    os.mkfifo(fifo_report / "summary.json")
    os.mkfifo(fifo_report / "run" / "results.json")
    fifo_sweep = root / "fifo_sweep" / "run"
    fifo_sweep.mkdir(parents=True)
    os.mkfifo(fifo_sweep / "config.json")
    (fifo_sweep / "policy.pt").write_bytes(b"x")
    empty_sweep = root / "empty_sweep"
    empty_sweep.mkdir()
    sweep = root / "sweep"
    (sweep / "run").mkdir(parents=True)
    (sweep / "run" / "policy.pt").write_bytes(b"trained policy bytes")
    own_json = root / "mine" / "notes.json"
    own_json.parent.mkdir()
    own_json.write_bytes(b'{"my": "notes"}\n')
    linked_json = root / "mine" / "link.json"
    linked_json.symlink_to(own_json)
    report_out = root / "report_out"
    report_out.mkdir()
    report_files = {
        report_out / name: f"the user's {name}\n".encode()
        for name in ("results.md", "results.csv", "README_results.md")
    }
    for path, content in report_files.items():
        path.write_bytes(content)
    planted = root / "planted_manifest"
    planted.mkdir()
    (planted / OUTPUTS_MANIFEST).symlink_to(own_json)
    dynamics_out = root / "dynamics_out"
    dynamics_out.mkdir()
    (dynamics_out / "dynamics_metrics.json").write_bytes(b'{"mine": 1}\n')
    return SimpleNamespace(
        fifo=fifo, folder=folder, not_checkpoints=not_checkpoints, fifo_report=fifo_report,
        fifo_sweep=fifo_sweep.parent, empty_sweep=empty_sweep, sweep=sweep, own_json=own_json,
        linked_json=linked_json, report_out=report_out, report_files=report_files,
        planted=planted, dynamics_out=dynamics_out,
    )  # fmt: skip


def _evil_config(root: Path) -> tuple[Path, Path]:
    """A config folder with a preset whose YAML would run code, and one that is no YAML;
    the file the code would make."""
    evil_config = root / "evil_config"
    (evil_config / "preset").mkdir(parents=True)
    sentinel = root / "yaml_code_ran"
    (evil_config / "preset" / "evil.yaml").write_text(
        f'seed: !!python/object/apply:os.system ["touch {sentinel}"]\n'
    )
    (evil_config / "preset" / "broken.yaml").write_text("seed: [0\n")
    return evil_config, sentinel


def write_inputs(root: Path) -> SimpleNamespace:
    """Writes every battery's inputs under ``root``; their paths by name."""
    (root / "data").mkdir(parents=True)
    unwritable, unwritable_part = unwritable_dir(root)
    evil_config, sentinel = _evil_config(root)
    collect_dirs = {kind: root / f"collect_{kind}" for kind in ("text", "h5", "provenance")}
    datasets = _damaged_datasets(root)
    for folder in collect_dirs.values():
        folder.mkdir()
    (collect_dirs["text"] / "hopper-random-gen.hdf5").write_bytes(b"not an HDF5 file\n")
    shutil.copy(datasets["base"], collect_dirs["h5"] / "hopper-random-gen.hdf5")  # the user's
    (collect_dirs["provenance"] / "hopper-random-gen.provenance.json").write_bytes(b"{}\n")
    return SimpleNamespace(
        root=root, data=root / "data", unwritable=unwritable, unwritable_part=unwritable_part,
        missing=root / "missing.hdf5", evil_config=evil_config, sentinel=sentinel,
        collect_dirs=collect_dirs, run_like={r: root / f"run_like_{r}" for r in ("false", "auto")},
        dyn_out=root / "dyn_out", **datasets, **vars(_user_files(root)),
    )  # fmt: skip


def edited_policy(finished_run: dict, tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of the run's ``policy.pt`` changed by ``edit(state)`` (a hostile file: its
    integrity digest is made again, as a deliberate edit would, so the checks of its content
    are what refuses it)."""
    state = torch.load(finished_run["run"] / "policy.pt", weights_only=True)
    edit(state)
    path = tmp_path / "policy.pt"
    torch.save(seal(state), path)
    return path
