"""Refusals of outputs and caches: no program replaces a file it did not write, nothing in a
cache runs code, a run notices every change to its data and checkpoint.

The cases that need a trained run share one debug run, trained and resumed inside this
process (tests/inprocess.py), on Pendulum-like data whose observations live in another file
(an HDF5 external link) under a folder whose name holds ``$(...)`` and a quote. The
ordinary bad values (one paragraph, exit code 2, no file touched) are in each program's
own file, tests/test_refusals_cbop_*.py.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from d4rl_files import pipeline_workspace, write_d4rl_hdf5
from inprocess import run_program
from programs import Call, run_programs
from refusals import TIMEOUT_S, case_env
from tensordict import NonTensorData, TensorDict, tensorclass

from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetError, data_record, load_dataset_with_info
from cbop_torchrl.data.d4rl import load_d4rl
from cbop_torchrl.data.safe_memmap import check_tensors_only
from cbop_torchrl.io import (
    OUTPUTS_MANIFEST,
    ForeignFileError,
    atomic_write,
    cache_dir,
    check_owned_output,
    owned_outputs,
    remove_stale_outputs,
)
from cbop_torchrl.runtime import override_word
from cbop_torchrl.trainers.checkpoint import (
    CheckpointError,
    load_checkpoint,
    seal,
    state_digest,
)
from cbop_torchrl.trainers.memory import process_limits, run_estimate
from cbop_torchrl.trainers.rundir import claim_run_dir

ROOT = Path(__file__).resolve().parents[1]


class _RunsCodeWhenUnpickled:
    """Unpickling this touches ``path``: what a hostile cache entry could do instead."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        return (Path.touch, (self.path,))


# ------------------------------------------------------------------------------ inputs


# -------------------------------------------------------------------------- code in a cache


def hostile_memmap(folder: Path, sentinel: Path, nested: bool = False) -> None:
    """A TensorDict memmap like TorchRL's D4RL cache, with one field whose pickle runs code."""
    rows = 4
    evil = NonTensorData(_RunsCodeWhenUnpickled(sentinel), batch_size=[rows])
    fields = {"observation": torch.zeros(rows, 3)}
    if nested:
        fields["next"] = TensorDict({"reward": torch.zeros(rows), "evil": evil}, [rows])
    else:
        fields["evil"] = evil
    TensorDict(fields, batch_size=[rows]).memmap_(folder)


def test_a_crafted_torchrl_d4rl_cache_runs_no_code(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sentinel = tmp_path / "code_ran"
    hostile_memmap(home / ".cache" / "torchrl" / "d4rl" / "hopper-medium-v2", sentinel)
    work = tmp_path / "work"
    work.mkdir()
    [done] = run_programs(
        [
            Call(
                "cbop.py", ["env=hopper-medium-v2", "preset=debug"], str(work), case_env(work, home)
            )
        ],  # fmt: skip
        timeout_s=TIMEOUT_S,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "TorchRL's cache of 'hopper-medium-v2'" in done.stderr
    assert "'NonTensorData'" in done.stderr and "Delete that directory" in done.stderr
    assert not sentinel.exists()


@tensorclass
class _Pair:
    left: torch.Tensor


def test_only_plain_tensors_pass_the_cache_check(tmp_path: Path) -> None:
    sentinel = tmp_path / "ran"
    hostile_memmap(tmp_path / "nested", sentinel, nested=True)
    with pytest.raises(DatasetError, match="'evil' of type 'NonTensorData'"):
        load_d4rl("hopper-medium-v2", torchrl_root=_torchrl_root_with(tmp_path, "nested"))
    TensorDict({"pair": _Pair(left=torch.zeros(2, 1), batch_size=[2])}, [2]).memmap_(
        tmp_path / "tensorclass"
    )
    with pytest.raises(DatasetError, match="not a tensor|not a plain TensorDict"):
        check_tensors_only(tmp_path / "tensorclass", "a cache", "Delete it.")
    plain = tmp_path / "plain"
    TensorDict({"a": torch.zeros(2, 1), "b": {"c": torch.ones(2)}}, [2]).memmap_(plain)
    check_tensors_only(plain, "a cache", "Delete it.")  # TorchRL's own layout passes
    (plain / "extra.pickle").write_bytes(b"\x80\x04N.")
    with pytest.raises(DatasetError, match="extra.pickle"):
        check_tensors_only(plain, "a cache", "Delete it.")
    (plain / "extra.pickle").unlink()
    (plain / "a.memmap").rename(plain / "a.bytes")
    (plain / "a.memmap").symlink_to(plain / "a.bytes")
    with pytest.raises(DatasetError, match="a link"):
        check_tensors_only(plain, "a cache", "Delete it.")
    assert not sentinel.exists()


def _torchrl_root_with(tmp_path: Path, name: str) -> Path:
    root = tmp_path / f"torchrl_{name}"
    (root / "d4rl").mkdir(parents=True)
    (tmp_path / name).rename(root / "d4rl" / "hopper-medium-v2")
    return root


# ---------------------------------------------------------------------------- owned outputs


def test_a_program_replaces_only_files_it_wrote(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "user.md").write_text("mine\n")
    with owned_outputs(out, "cbop-report"):
        atomic_write(out / "results.md", lambda tmp: tmp.write_text("first\n"))
        atomic_write(out / "results.md", lambda tmp: tmp.write_text("second\n"))  # its own
        with pytest.raises(ForeignFileError, match="user.md"):
            atomic_write(out / "user.md", lambda tmp: tmp.write_text("replaced\n"))
    assert (out / "results.md").read_text() == "second\n"
    assert (out / "user.md").read_text() == "mine\n"
    manifest = json.loads((out / OUTPUTS_MANIFEST).read_text())
    assert manifest["files"] == {"results.md": "cbop-report"}
    (out / "notes.md").symlink_to(out / "user.md")
    with pytest.raises(ForeignFileError, match="is a link"):
        check_owned_output(out / "notes.md", "cbop-report")
    earlier = out / "earlier.json"  # what an output would hold: not ours without the manifest
    earlier.write_text("[]\n")
    with pytest.raises(ForeignFileError, match="earlier.json"):
        check_owned_output(earlier, "cbop-select-psi")


def test_only_a_programs_own_files_it_no_longer_writes_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "user.png").write_text("mine\n")
    with owned_outputs(out, "cbop-report"):
        for name in ("results.md", "rh_cbop.png", "rh_cbop (file a).png"):
            atomic_write(out / name, lambda tmp: tmp.write_text("report\n"))
    with owned_outputs(out, "cbop-select-psi"):
        atomic_write(out / "psi.json", lambda tmp: tmp.write_text("[]\n"))
    removed = remove_stale_outputs(out, "cbop-report", [out / "results.md", out / "rh_cbop.png"])
    assert removed == [out / "rh_cbop (file a).png"]
    assert sorted(p.name for p in out.iterdir() if p.name != OUTPUTS_MANIFEST) == [
        "psi.json", "results.md", "rh_cbop.png", "user.png",
    ]  # fmt: skip
    manifest = json.loads((out / OUTPUTS_MANIFEST).read_text())["files"]
    assert manifest == {"psi.json": "cbop-select-psi", "results.md": "cbop-report",
                        "rh_cbop.png": "cbop-report"}  # fmt: skip
    assert remove_stale_outputs(out, "cbop-report", [out / "results.md", out / "rh_cbop.png"]) == []


# ---------------------------------------------------------------------------- a trained run


def pendulum_workspace(root: Path) -> dict:
    """Pendulum-like data under a folder named with ``$(...)`` and a quote, its observations
    an external link to ``obs.h5``; ``{"root", "dataset", "obs", "env", "task"}``."""
    folder = root / "it's $(touch PWNED) here"
    folder.mkdir()
    dataset = write_d4rl_hdf5(
        folder / "pendulum-data.hdf5", obs_dim=3, action_dim=1, episode_lengths=(150,) * 8,
        terminal_episodes=(), timeout_episodes=(),
    )  # fmt: skip
    with h5py.File(dataset, "a") as handle:
        observations = handle["observations"][()]
        del handle["observations"]
        handle["observations"] = h5py.ExternalLink("obs.h5", "/values")
    with h5py.File(folder / "obs.h5", "w") as handle:
        handle["values"] = observations
    return {
        "root": root, "folder": folder, "dataset": dataset, "obs": folder / "obs.h5",
        "env": {"CBOP_TORCHRL_CACHE": str(root / "cache")},
        "task": ["task.gym_id=Pendulum-v1", "task.termination=none", "estimator.psi=1"],
    }  # fmt: skip


@dataclass
class TrainedCases:
    """What the trained-run fixture ran: the training, and each case's run directory and
    result by name."""

    training: object
    workspace: dict
    results: dict[str, object] = field(default_factory=dict)
    run_dirs: dict[str, Path] = field(default_factory=dict)


def _xor_tensor_words(checkpoint: Path, words: int = 100) -> None:
    """XORs the low byte of ``words`` 4-byte words inside the checkpoint's tensor storages."""
    with zipfile.ZipFile(checkpoint) as archive:
        entries = [info for info in archive.infolist() if "/data/" in info.filename]
        entry = max(entries, key=lambda info: info.file_size)
    with open(checkpoint, "r+b") as handle:
        handle.seek(entry.header_offset + 26)
        name_length, extra_length = np.frombuffer(handle.read(4), dtype="<u2")
        start = entry.header_offset + 30 + int(name_length) + int(extra_length)
        positions = np.random.default_rng(0).choice(entry.file_size // 4, words, replace=False)
        for position in positions:
            handle.seek(start + 4 * int(position))
            byte = handle.read(1)[0]
            handle.seek(start + 4 * int(position))
            handle.write(bytes([byte ^ 0xFF]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedCases:
    """One debug run, then copies of its directory damaged or resumed in each case's way."""
    root = tmp_path_factory.mktemp("trained")
    workspace = pendulum_workspace(root)
    env_word = override_word("env", str(workspace["dataset"]))
    base = root / "run"
    command = ["preset=debug", env_word, *workspace["task"]]
    saved_cwd = os.getcwd()
    os.chdir(root)  # the suggested baseline command writes its run under runs/ here
    try:  # with progress, the run prints its banner (and the baseline command in it)
        training = run_program(
            "cbop", [*command, "progress=true", f"hydra.run.dir={base}"], workspace["env"]
        )
        command.append("progress=false")
        cases = TrainedCases(training, workspace)
        if training.returncode != 0:
            return cases

        def resume(name: str, damage) -> None:  # noqa: ANN001
            run_dir = root / name
            shutil.copytree(base, run_dir)
            damage(run_dir)
            cases.run_dirs[name] = run_dir
            cases.results[name] = run_program(
                "cbop", [*command, override_word("hydra.run.dir", str(run_dir))], workspace["env"]
            )

        def edit_tensor(run_dir: Path) -> None:  # a changed value, the file still loadable
            path = run_dir / "checkpoint.pt"
            state = torch.load(path, weights_only=True)
            state["actor"] = {k: v + 1e-3 for k, v in state["actor"].items()}
            torch.save(state, path)

        resume("xor", lambda run_dir: _xor_tensor_words(run_dir / "checkpoint.pt"))
        resume("edited", edit_tensor)
        resume("truncated data.json", lambda d: (d / "data.json").write_text('{"conte'))
        resume("no data.json, same data", lambda d: (d / "data.json").unlink())

        def non_json_results(run_dir: Path) -> None:
            (root / "elsewhere.bin").write_bytes(b"\x00\x01 not json")
            (run_dir / "results.json").unlink()
            (run_dir / "results.json").symlink_to(root / "elsewhere.bin")

        resume("results.json linked to a non-JSON file", non_json_results)

        def garbage_results(run_dir: Path) -> None:
            (run_dir / "results.json").write_bytes(b"\x00\x01 not json")

        resume("results.json not JSON", garbage_results)
        policy = base / "policy.pt"
        cases.results["policy.pt before"] = policy.read_bytes()
        report_out = root / "my_report"
        report_out.mkdir()
        (report_out / "results.md").write_text("my own results\n")
        env = {**os.environ, **workspace["env"]}
        select, report = run_programs(
            [
                Call("select_psi.py", [override_word("sweep_dir", str(root)), "steps=20",
                     "progress=false", override_word("json", str(policy))], root, env),
                Call("report.py", [override_word("paths", str(base)),
                     override_word("out", str(report_out)), "analysis=false",
                     "rliable_reps=100"], root, env),
            ],
            timeout_s=TIMEOUT_S + 60,
        )  # fmt: skip
        cases.results["select-psi json=policy.pt"] = select
        cases.results["report out=<user folder>"] = report
        line = next(
            line for line in training.stdout.splitlines() if "a baseline with the same" in line
        )
        cases.results["suggested command"] = line.partition("(algo=bc|td3bc|iql|cql): ")[2]
        words = shlex.split(cases.results["suggested command"])  # as the shell reads it
        cases.results["baseline"] = run_program("baseline", words[1:], workspace["env"])

        with h5py.File(workspace["obs"], "a") as handle:  # only the linked file changes
            handle["values"][0, 0] = 123.0
        resume("linked file changed", lambda run_dir: None)
        resume("linked file changed, no data.json", lambda d: (d / "data.json").unlink())
    finally:
        os.chdir(saved_cwd)
    return cases


def _error(done) -> str:  # noqa: ANN001
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_the_debug_run_trains(trained: TrainedCases) -> None:
    done = trained.training
    assert done.returncode == 0, done.stdout + done.stderr
    state = load_checkpoint(trained.workspace["root"] / "run" / "checkpoint.pt")
    assert state["integrity"] == state_digest(state)
    recorded = json.loads((trained.workspace["root"] / "run" / "data.json").read_text())
    assert state["data"] == recorded
    assert (trained.workspace["root"] / "run" / ".hydra" / "overrides.yaml").is_file()
    assert not (trained.workspace["folder"] / "PWNED").exists()


@pytest.mark.parametrize("name", ["xor", "edited"])
def test_a_damaged_checkpoint_is_refused_on_resume(trained: TrainedCases, name: str) -> None:
    error = _error(trained.results[name])
    assert "checkpoint.pt" in error
    assert "damaged" in error and "resume=false" in error
    assert "learning rate" not in error


def test_a_missing_or_unreadable_data_record_is_not_an_earlier_version(
    trained: TrainedCases,
) -> None:
    error = _error(trained.results["truncated data.json"])
    assert "data.json is not a readable record" in error and "hydra.run.dir=" in error
    done = trained.results["no data.json, same data"]  # the checkpoint's record restores it
    assert done.returncode == 0, done.stdout + done.stderr
    restored = json.loads((trained.run_dirs["no data.json, same data"] / "data.json").read_text())
    assert restored == json.loads((trained.workspace["root"] / "run" / "data.json").read_text())


@pytest.mark.parametrize("name", ["linked file changed", "linked file changed, no data.json"])
def test_a_change_to_a_linked_file_is_a_change_of_the_data(
    trained: TrainedCases, name: str
) -> None:
    error = _error(trained.results[name])
    assert "was started on other data" in error and "pendulum-data" in error


def test_a_results_json_that_is_no_json_is_one_paragraph(trained: TrainedCases) -> None:
    error = _error(trained.results["results.json linked to a non-JSON file"])
    assert "results.json" in error and "never writes through a link" in error
    assert (trained.workspace["root"] / "elsewhere.bin").read_bytes() == b"\x00\x01 not json"
    error = _error(trained.results["results.json not JSON"])
    assert "results.json' cannot be read as JSON" in error and "resume=false" in error


def test_select_psi_and_report_never_replace_a_trained_runs_or_a_users_file(
    trained: TrainedCases,
) -> None:
    root = trained.workspace["root"]
    error = _error(trained.results["select-psi json=policy.pt"])
    assert "policy.pt" in error and "was not written by cbop-torchrl" in error
    assert (root / "run" / "policy.pt").read_bytes() == trained.results["policy.pt before"]
    error = _error(trained.results["report out=<user folder>"])
    assert "results.md" in error and "was not written by cbop-torchrl" in error
    assert (root / "my_report" / "results.md").read_text() == "my own results\n"
    assert sorted(p.name for p in (root / "my_report").iterdir()) == ["results.md"]


def test_the_suggested_baseline_command_runs_as_written(trained: TrainedCases) -> None:
    command = trained.results["suggested command"]
    assert "task.gym_id=Pendulum-v1" in command and "task.termination=none" in command
    words = shlex.split(command)
    assert words[0].endswith("cbop-baseline"), words
    done = trained.results["baseline"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Pendulum-v1" in done.stdout + done.stderr
    assert not (trained.workspace["folder"] / "PWNED").exists()


def test_a_new_run_reads_the_changed_linked_file(tmp_path: Path) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(30, 30))
    with h5py.File(file, "a") as handle:
        observations = handle["observations"][()]
        del handle["observations"]
        handle["observations"] = h5py.ExternalLink("obs.h5", "/values")
    with h5py.File(tmp_path / "obs.h5", "w") as handle:
        handle["values"] = observations
    data, info = load_dataset_with_info(str(file))
    with h5py.File(tmp_path / "obs.h5", "a") as handle:
        handle["values"][0, 0] = 77.0
    again, again_info = load_dataset_with_info(str(file))
    assert float(data["observation"][0, 0]) != 77.0
    assert float(again["observation"][0, 0]) == 77.0  # not the stale cached arrays
    assert data_record(info)["content"] != data_record(again_info)["content"]


def test_a_sealed_state_notices_one_changed_value() -> None:
    state = seal({"format": "x", "weights": {"w": torch.arange(6.0)}, "step": 3})
    assert state_digest(state) == state["integrity"]
    state["weights"]["w"][4] += 1e-6
    assert state_digest(state) != state["integrity"]
    assert state_digest({"a": torch.zeros(2, dtype=torch.bfloat16)}) != state_digest(
        {"a": torch.zeros(2, dtype=torch.float16)}
    )


def test_a_damaged_policy_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.pt"
    state = seal({"format": "cbop-torchrl/1", "policy": {}, "actor": {"w": torch.ones(3)}})
    state["actor"]["w"][0] = 2.0
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="is damaged"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------------- memory


def test_the_estimate_counts_fqe_bootstrap_counts_and_reads_process_limits() -> None:
    config = RunConfig()
    config.agent.num_qvalue_nets = 1000
    small = run_estimate(config, 11, 3, num_rows=1000)
    large = run_estimate(config, 11, 3, num_rows=10_000_000)
    assert large.total - small.total >= 1000 * (10_000_000 - 1000)
    assert any("FQE bootstrap counts" in part for part in large.parts)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    assert all(size >= 0 for size, _ in process_limits())
    assert (soft != resource.RLIM_INFINITY) == any("ulimit -v" in w for _, w in process_limits())


def test_sizes_beyond_the_address_space_limit_are_refused(tmp_path: Path) -> None:
    workspace = pipeline_workspace(tmp_path)
    limit = 8 * 10**9

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cbop.py"), "preset=debug", "progress=false",
         f"env={workspace['dataset']}", "agent.num_qvalue_nets=100000",
         f"hydra.run.dir={tmp_path / 'run'}"],
        env={**case_env(tmp_path), "CBOP_TORCHRL_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=limited, cwd=tmp_path,
    )  # fmt: skip
    error = _error(done)
    assert "address-space limit (ulimit -v)" in error and "agent.num_qvalue_nets" in error
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------- more cases


def test_a_run_never_writes_through_a_link_in_its_own_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "my_logs"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine\n")
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir)
    (run_dir / "logs").symlink_to(elsewhere)  # the csv logger would write into my_logs/
    with pytest.raises(CheckpointError, match=r"holds links .*\(logs\)"):
        claim_run_dir(run_dir)
    assert [p.name for p in elsewhere.iterdir()] == ["notes.txt"]


def test_a_damaged_dataset_cache_summary_is_one_paragraph(tmp_path: Path) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(6, 5))
    _, info = load_dataset_with_info(str(file))
    entry = cache_dir("datasets") / info.fingerprint
    (entry / "info.json").write_text('{"fingerpr')
    with pytest.raises(DatasetError, match="info.json.*delete that directory"):
        load_dataset_with_info(str(file))


@pytest.mark.parametrize(
    "path", ["/data/it's $(touch x), a b/d.hdf5", "/data/${HOME}/d.hdf5", "C:\\data\\", "null"]
)
def test_a_suggested_command_gives_hydra_the_path_as_it_is(path: str) -> None:
    from types import SimpleNamespace

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from cbop_torchrl.envs.task import example_command

    words = shlex.split(example_command(SimpleNamespace(source=path), "Swimmer-v4"))
    env_word = next(word for word in words if word.startswith("env="))
    value = OverridesParser.create().parse_override(env_word).value()
    assert OmegaConf.create({"env": value}).env == path  # no interpolation, no other type
    assert "task.gym_id=Swimmer-v4" in words
