"""Refusals across programs: each guarantee holds for every program and every cause.

One mechanism per class, each tested on the reported cases and on forms not reported:

- ranges in one place (``config.SETTING_RANGES``): every numeric setting of every program
  refused before any work, with one paragraph;
- special files skipped or refused (``io.walking.find_regular_files``, ``io.read_regular_bytes``):
  no program blocks on a FIFO it found by walking a folder or was given by name;
- output ownership by the marker alone and no write through a link (``rundir.claim_run_dir``,
  ``io.check_owned_output``, ``io.check_no_link``);
- stage caches with a checksum and a data record (``checkpoint.save_stage``/``read_stage``);
- one paragraph for every refused write (``io.WriteRefusedError``, ``io.refused_write``,
  ``cli.hydra_entry``).

The battery of refused commands that these mechanisms stop is in each program's own file,
tests/test_refusals_cbop_*.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from d4rl_files import pipeline_workspace, write_d4rl_hdf5
from inprocess import train_cbop
from programs import Call, run_programs
from refusals import TIMEOUT_S, case_env

from cbop_torchrl.config import PretrainConfig, RunConfig, range_problems
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.io import (
    DiskFullError,
    ForeignFileError,
    WriteRefusedError,
    add_write_root,
    atomic_write,
    cache_dir,
    check_owned_output,
    deferred_replace,
    owned_outputs,
    read_regular_bytes,
    refused_write,
)
from cbop_torchrl.trainers.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_stage,
    save_stage,
)
from cbop_torchrl.trainers.dynamics import DynamicsConfig, load_or_train_dynamics
from cbop_torchrl.trainers.memory import run_estimate
from cbop_torchrl.trainers.pretrain import load_or_train_bc
from cbop_torchrl.trainers.rundir import MARKER_NAME, claim_run_dir

ROOT = Path(__file__).resolve().parents[1]
TINY_DYNAMICS = {"num_members": 3, "num_elites": 2, "hidden_size": 8, "num_layers": 1,
                 "weight_decay": (0.0, 0.0), "batch_size": 32, "max_epochs": 1}  # fmt: skip


# -------------------------------------------------------------------------- one range table


@pytest.mark.parametrize(
    ("values", "word"),
    [
        ({"dynamics": {"lr": 0.0}}, "dynamics.lr=0.0 must be a positive number"),
        ({"dynamics": {"weight_decay": [1e-4, -1.0]}}, "dynamics.weight_decay=[0.0001,-1.0]"),
        ({"dynamics": {"max_holdout": 0}}, "dynamics.max_holdout=0 must be an integer >= 1"),
        ({"fqe": {"target_tau": 1.5}}, "fqe.target_tau=1.5 must be a number in (0, 1]"),
        ({"agent": {"hidden_sizes": []}}, "agent.hidden_sizes=[] must be a list of at least 1"),
        ({"compression_level": 10}, "compression_level=10 must be an integer in [0, 9]"),
        ({"qvalue_nets": 1}, "qvalue_nets=1 must be an integer >= 2"),
        ({"sac": {"tau": 0.0}}, "sac.tau=0.0 must be a number in (0, 1]"),
        ({"eval": {"start_states": -1}}, "eval.start_states=-1 must be an integer >= 0"),
        ({"algo": {"expectile": 1.0}}, "algo.expectile=1.0 must be a number in (0, 1)"),
    ],
)
def test_every_range_is_in_the_one_table(values: dict, word: str) -> None:
    problems = range_problems(values)
    assert len(problems) == 1 and problems[0].startswith(word), problems


def test_the_default_configs_hold_their_ranges() -> None:
    assert range_problems(RunConfig().to_dict()) == []
    assert range_problems({"dynamics": DynamicsConfig().to_dict()}) == []


# ----------------------------------------------------------------- memory of the evaluation


def test_the_estimate_counts_the_start_state_evaluation() -> None:
    config = RunConfig()
    config.agent.num_qvalue_nets = 2
    plain = run_estimate(config, 11, 3, num_rows=1_000_000)
    config.eval.start_states = 100_000_000
    many = run_estimate(config, 11, 3, num_rows=1_000_000)
    assert many.total - plain.total > 1_000_000 * 2**20  # one simulation per state, <= rows
    assert any("eval.start_states" in part for part in many.parts)
    config.agent.hidden_sizes = []  # refused by the ranges; the estimate itself never fails
    run_estimate(config, 11, 3, num_rows=10)


def test_start_states_beyond_the_address_space_limit_are_refused(tmp_path: Path) -> None:
    workspace = pipeline_workspace(tmp_path)
    # the limit is set by the shell (ulimit -v, in KB), not by a preexec_fn: forking this
    # multi-threaded test process and running Python before exec can deadlock
    done = subprocess.run(
        ["bash", "-c", 'ulimit -v 7812500 && exec "$0" "$@"', sys.executable,
         str(ROOT / "scripts" / "cbop.py"), "preset=debug", "progress=false",
         f"env={workspace['dataset']}", "eval.start_states=100000000",
         f"hydra.run.dir={tmp_path / 'run'}"],
        env=case_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S * 2,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "eval.start_states" in done.stderr
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


# ---------------------------------------------------------------- special files, one walker


def test_the_walker_skips_special_files_and_the_kernels_folders(tmp_path: Path) -> None:
    from cbop_torchrl.io.walking import find_regular_files as find_files

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text("{}")
    os.mkfifo(tmp_path / "a" / "fifo.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "a" / "fifo.json")
    (tmp_path / "proc").symlink_to("/proc/self")  # a link into the kernel's folders
    (tmp_path / "dev").symlink_to("/dev")
    assert find_files(tmp_path, "*.json") == [tmp_path / "a" / "results.json"]
    with pytest.raises(OSError, match="FIFO"):
        read_regular_bytes(tmp_path / "link.json")  # by name: refused, never blocks
    with pytest.raises(OSError, match="folder"):
        read_regular_bytes(tmp_path / "a")


# ---------------------------------------------------- ownership by marker, never via a link


def test_ownership_is_the_marker_alone(tmp_path: Path) -> None:
    looks_like_a_run = tmp_path / "theirs"
    looks_like_a_run.mkdir()
    (looks_like_a_run / ".run.lock").write_text("")
    (looks_like_a_run / "results.json").write_text('{"gradient_steps": 1}')
    torch.save({"format": "cbop-torchrl/1", "step": 1}, looks_like_a_run / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="the marker alone"):
        claim_run_dir(looks_like_a_run)
    assert not (looks_like_a_run / MARKER_NAME).exists()
    out = tmp_path / "out"
    out.mkdir()
    (out / "selection.json").write_text('[{"env": 1, "dataset": 1, "selected": 1, '
                                        '"candidates": []}]')  # fmt: skip
    with pytest.raises(ForeignFileError, match="was not written by cbop-torchrl"):
        check_owned_output(out / "selection.json", "cbop-select-psi")  # looks like ours: not


def test_no_write_goes_through_a_linked_folder_below_a_write_root(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir)
    (run_dir / "selection_fqe").symlink_to(victim)
    with pytest.raises(ForeignFileError, match="selection_fqe' is a link"):
        atomic_write(run_dir / "selection_fqe" / "key" / "result.pt", lambda t: t.write_text("x"))
    cache = cache_dir()
    (cache / "pretrain").mkdir(exist_ok=True)
    (cache / "pretrain" / "bc").symlink_to(victim)  # below the cache root too
    with pytest.raises(ForeignFileError, match="is a link"):
        cache_dir("pretrain", "bc", "abc")
    nested = tmp_path / "other_run"
    add_write_root(nested)
    (nested / "logs").mkdir(parents=True)
    (nested / "logs" / "deep").symlink_to(victim)
    with pytest.raises(ForeignFileError, match="deep' is a link"):
        atomic_write(nested / "logs" / "deep" / "x" / "y.csv", lambda t: t.write_text("x"))
    assert list(victim.iterdir()) == []


# --------------------------------------------------------- one paragraph for refused writes


@pytest.mark.parametrize(
    ("code", "cause"),
    [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied"),
     (errno.ENAMETOOLONG, "File name too long"), (errno.EPERM, "Operation not permitted")],
)  # fmt: skip
def test_a_refused_write_names_the_file_and_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, cause: str
) -> None:
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(code, os.strerror(code), str(args[1]))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(WriteRefusedError) as error:
        atomic_write(tmp_path / "out.json", lambda tmp: tmp.write_text("{}"))
    assert "out.json" in str(error.value) and cause in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary left
    h5py_like = OSError(f"Unable to create file (unable to open file: name = '/ro/x.hdf5', "
                        f"errno = {code}, error message = '{cause}', flags = 13)")  # fmt: skip
    assert refused_write(RuntimeError("not an OS error")) is None
    found = refused_write(h5py_like)
    assert found is not None and "/ro/x.hdf5" in str(found) and cause in str(found)


def test_a_program_whose_write_is_refused_says_so_in_one_paragraph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """cbop-report on a folder the OS refuses to write: exit 2, one paragraph, the file and
    the cause, ``out=`` suggested (not ``hydra.run.dir``), and no mix of old and new files."""
    summary = {
        "summary_format": "cbop-torchrl-summary/1", "variant": "cbop", "dataset": "d",
        "seed": 0, "final_normalized_score": 1.0, "best_normalized_score": 2.0,
        "gradient_steps": 10, "curve": [[10, 1.0]],
    }  # fmt: skip
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "seed0.json").write_text(json.dumps(summary))
    out = tmp_path / "report"
    import cbop_torchrl.io.atomic as atomic

    real_temporary = atomic.make_temporary

    def refuse_figures(directory, name, is_dir=False):  # noqa: ANN001, ANN202
        if name.endswith(".png"):  # the OS refuses the figures' files, after the tables
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(directory / name))
        return real_temporary(directory, name, is_dir)

    monkeypatch.setattr(atomic, "make_temporary", refuse_figures)
    from cbop_torchrl.evaluation.summaries import SUMMARY_FORMAT

    summary["summary_format"] = SUMMARY_FORMAT
    (tmp_path / "runs" / "seed0.json").write_text(json.dumps(summary))
    from cbop_torchrl.apps import report

    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))
    code = report.main(
        [f"paths={tmp_path / 'runs'}", f"out={out}", "analysis=false", "rliable_reps=100"]
    )
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr
    assert "Read-only file system" in errors[0] and ".png" in errors[0]
    assert "out=" in errors[0] and "hydra.run.dir" not in errors[0]
    assert "Traceback" not in stderr
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert left in ([], [".cbop-outputs.json"]), left  # no table without its figures


def test_a_full_disk_in_a_report_changes_no_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with owned_outputs(out, "cbop-report"):
        atomic_write(out / "results.md", lambda tmp: tmp.write_text("old\n"))  # ours
    with pytest.raises(DiskFullError), owned_outputs(out, "cbop-report"), deferred_replace():
        atomic_write(out / "results.md", lambda tmp: tmp.write_text("new\n"))
        atomic_write(out / "results.csv", lambda tmp: tmp.write_text("new\n"))
        raise DiskFullError("no space left while drawing a figure")
    assert (out / "results.md").read_text() == "old\n"
    assert sorted(p.name for p in out.iterdir()) == [".cbop-outputs.json", "results.md"]


def test_low_free_space_is_refused_when_the_run_directory_is_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 10 * 10**6))
    with pytest.raises(DiskFullError) as error:
        claim_run_dir(tmp_path / "run", needed_bytes=300_000)
    message = str(error.value)
    assert "16 MB margin" in message and "300 KB" in message and "10 MB free" in message
    assert not (tmp_path / "run" / MARKER_NAME).exists()


# --------------------------------------------------- stage caches, checksum and data record


def _two_datasets(tmp_path: Path) -> list[tuple]:
    loaded = []
    for seed in (0, 1):
        file = write_d4rl_hdf5(
            tmp_path / f"hopper-{seed}.hdf5", episode_lengths=(60, 60), seed=seed
        )
        loaded.append(load_dataset_with_info(str(file)))
    return loaded


def test_a_dynamics_model_of_other_data_is_trained_again(tmp_path: Path) -> None:
    (data_a, info_a), (data_b, info_b) = _two_datasets(tmp_path)
    config = DynamicsConfig(**TINY_DYNAMICS)
    _, metrics_a = load_or_train_dynamics(data_a, info_a, config, False, termination="hopper")
    _, metrics_b = load_or_train_dynamics(data_b, info_b, config, False, termination="hopper")
    path_a, path_b = Path(metrics_a["cache_path"]), Path(metrics_b["cache_path"])
    stage = torch.load(path_b, weights_only=True)["stage"]
    assert stage["data"]["content"] == info_b.sha256 and stage["entry"] == path_b.parent.name
    shutil.copy(path_a, path_b)  # the reported case: a model of other data in this entry
    with pytest.warns(UserWarning, match="belongs to another cache entry"):
        _, again = load_or_train_dynamics(data_b, info_b, config, False, termination="hopper")
    assert again["cached"] is False
    state = torch.load(path_b, weights_only=True)  # a form not listed: same entry, edited
    state["state_dict"] = {k: v + 1 for k, v in state["state_dict"].items()}
    torch.save(state, path_b)
    with pytest.warns(UserWarning, match="is damaged"):
        _, again = load_or_train_dynamics(data_b, info_b, config, False, termination="hopper")
    assert again["cached"] is False
    state = torch.load(path_b, weights_only=True)  # another: resealed, but other data's
    state.pop("integrity")
    record = dict(state.pop("stage")["data"], content="0" * 64)
    save_stage(state, path_b, record)
    with pytest.warns(UserWarning, match="was trained on other data"):
        _, again = load_or_train_dynamics(data_b, info_b, config, False, termination="hopper")
    assert again["cached"] is False
    _, cached = load_or_train_dynamics(data_b, info_b, config, False, termination="hopper")
    assert cached["cached"] is True


def test_a_swapped_pretraining_result_is_trained_again(tmp_path: Path) -> None:
    (data, info), _ = _two_datasets(tmp_path)
    config = PretrainConfig(steps=4, batch_size=8, checkpoint_interval=2)
    hidden = [8]
    runs = [
        load_or_train_bc(data, info.fingerprint, info.obs_dim, info.action_dim, hidden, config,
                         seed, progress=False)
        for seed in (0, 1)
    ]  # fmt: skip
    assert not any(cached for _, cached in runs)
    results = sorted(cache_dir("pretrain", "bc").glob("*/result.pt"))
    assert len(results) == 2
    shutil.copy(results[0], results[1])  # another seed's result in this entry
    with pytest.warns(UserWarning, match="belongs to another cache entry"):
        state, cached = load_or_train_bc(data, info.fingerprint, info.obs_dim, info.action_dim,
                                         hidden, config, 1, progress=False)  # fmt: skip
    assert not cached
    torch.save({"actor": state}, results[1])  # a form not listed: no checksum, no record
    with pytest.warns(UserWarning, match="no SHA-256"):
        _, cached = load_or_train_bc(data, info.fingerprint, info.obs_dim, info.action_dim,
                                     hidden, config, 1, progress=False)  # fmt: skip
    assert not cached


def test_read_stage_checks_the_entry_and_the_data(tmp_path: Path) -> None:
    entry = tmp_path / "abc123"
    path = entry / "result.pt"
    save_stage({"fit": {"w": torch.ones(2)}}, path, {"fingerprint": "data-1"})
    assert read_stage(path, {"fingerprint": "data-1"}, "fit") is not None
    with pytest.warns(UserWarning, match="other data"):
        assert read_stage(path, {"fingerprint": "data-2"}, "fit") is None
    assert not path.exists()  # removed: the stage is trained again
    save_stage({"fit": {"w": torch.ones(2)}}, path, None)
    moved = tmp_path / "def456" / "result.pt"
    moved.parent.mkdir()
    shutil.copy(path, moved)
    with pytest.warns(UserWarning, match="another cache entry"):
        assert read_stage(moved, None, "fit") is None
    (tmp_path / "text.pt").write_text("not a stage\n")
    with pytest.warns(UserWarning, match="it is a text file"):
        assert read_stage(tmp_path / "text.pt", None, "fit") is None


# -------------------------------------------------------- select-psi on a trained debug run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("trained4")
    workspace = pipeline_workspace(root, episode_lengths=(60,) * 6)
    env = {"CBOP_TORCHRL_CACHE": str(root / "cache")}
    run_dir = root / "run"
    overrides = ["preset=debug", f"env={workspace['dataset']}", "progress=false",
                 "train.epochs=1", "train.steps_per_epoch=20", "bc.steps=20", "fqe.steps=20",
                 "dynamics.max_epochs=2", "eval.episodes=1", "eval.max_steps=10"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_cbop(overrides, run_dir, env)
    return {"root": root, "run": run_dir, "env": env, "dataset": workspace["dataset"]}


def _sweep_with(root: Path, name: str, make) -> Path:  # noqa: ANN001
    sweep = root / name
    sweep.mkdir()
    make(sweep)
    return sweep


@pytest.fixture(scope="module")
def selected(trained_run: dict) -> dict:
    """Every program call of the select-psi and working-directory cases, in two children:
    the first batch, then the swapped fit's re-run."""
    root, run = trained_run["root"], trained_run["run"]
    victim = root / "victim"
    victim.mkdir()

    def linked_selection(sweep: Path) -> None:
        shutil.copytree(run, sweep / "run")
        (sweep / "run" / "selection_fqe").symlink_to(victim)

    def unmarked(sweep: Path) -> None:
        shutil.copytree(run, sweep / "run")
        (sweep / "run" / MARKER_NAME).unlink()

    outside = root / "kept_elsewhere"
    shutil.copytree(run, outside)

    def linked_run(sweep: Path) -> None:
        (sweep / "run").symlink_to(outside)

    sweeps = {
        "linked selection_fqe": _sweep_with(root, "s_link", linked_selection),
        "unmarked run": _sweep_with(root, "s_unmarked", unmarked),
        "linked run": _sweep_with(root, "s_outside", linked_run),
        "swap": _sweep_with(root, "s_swap", lambda sweep: shutil.copytree(run, sweep / "a")),
    }
    env = {**os.environ, **trained_run["env"]}
    calls = {
        name: Call("select_psi.py", [f"sweep_dir={sweep}", "steps=4", "progress=false"], root, env)
        for name, sweep in sweeps.items()
    }
    calls["swap 6"] = Call(
        "select_psi.py", [f"sweep_dir={sweeps['swap']}", "steps=6", "progress=false"], root, env
    )
    cwd, out = root / "cwd", root / "outputs"
    cwd.mkdir()
    calls.update({
        "evaluate": Call("evaluate.py", [f"checkpoint={run / 'policy.pt'}", "episodes=1",
                         "max_steps=5", f"output={out / 'eval.json'}"], cwd, env),
        "report": Call("report.py", [f"paths={run}", f"out={out / 'report'}", "analysis=false",
                                     "rliable_reps=100"], cwd, env),
        "select json": Call("select_psi.py", [f"sweep_dir={run}", "steps=4", "progress=false",
                            f"json={out / 'sel.json'}"], cwd, env),
        "train-dynamics": Call("train_dynamics.py", [f"env={trained_run['dataset']}",
                               "dynamics.max_epochs=1", "progress=false",
                               f"output_dir={out / 'dyn'}"], cwd, env),
    })  # fmt: skip
    results = run_programs(list(calls.values()), TIMEOUT_S * len(calls))  # a loaded machine
    done = dict(zip(calls, results, strict=True))
    fits = sorted((sweeps["swap"] / "a" / "selection_fqe").glob("*/result.pt"))
    if len(fits) == 2:
        fits[0].write_bytes(fits[1].read_bytes())  # the reported case: a swapped fit
        again = [calls["swap"], calls["swap 6"]]
        done["swap again"], done["swap 6 again"] = run_programs(again, TIMEOUT_S * 3)
    return {"done": done, "sweeps": sweeps, "victim": victim, "outside": outside, "cwd": cwd,
            "fits": fits, "root": root}  # fmt: skip


def test_select_psi_writes_only_into_marked_runs_of_its_sweep(selected: dict) -> None:
    done, sweeps = selected["done"], selected["sweeps"]
    link = done["linked selection_fqe"]
    assert link.returncode == 2 and "is a link" in link.stderr and "Traceback" not in link.stderr
    assert list(selected["victim"].iterdir()) == []
    for name in ("unmarked run", "linked run"):
        assert done[name].returncode == 0, done[name].stderr[-2000:]
    assert not (sweeps["unmarked run"] / "run" / "selection_fqe").exists()
    assert not (selected["outside"] / "selection_fqe").exists()
    assert list((selected["root"] / "cache" / "selection_fqe").glob("*/result.pt"))


def test_a_swapped_selection_fit_is_fitted_again(selected: dict) -> None:
    done = selected["done"]
    assert len(selected["fits"]) == 2, done["swap"].stderr[-2000:]
    for name in ("swap", "swap 6", "swap again", "swap 6 again"):
        assert done[name].returncode == 0, done[name].stderr[-2000:]
    assert (
        "belongs to another cache entry" in done["swap again"].stderr + done["swap 6 again"].stderr
    )
    assert done["swap again"].stdout == done["swap"].stdout  # the scores of the right fits
    assert done["swap 6 again"].stdout == done["swap 6"].stdout


def test_no_program_writes_into_the_working_directory(selected: dict) -> None:
    """Each program given absolute output paths leaves the working directory empty
    (MuJoCo's MUJOCO_LOG.TXT included)."""
    for name in ("evaluate", "report", "select json", "train-dynamics"):
        done = selected["done"][name]
        assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in selected["cwd"].iterdir()) == []


def test_a_policy_with_complex_weights_is_refused(trained_run: dict, tmp_path: Path) -> None:
    state = torch.load(trained_run["run"] / "policy.pt", weights_only=True)
    name = next(iter(state["actor"]))
    state["actor"][name] = state["actor"][name].to(torch.complex64)
    from cbop_torchrl.trainers.checkpoint import seal

    state.pop("integrity")
    torch.save(seal(state), tmp_path / "policy.pt")
    with pytest.raises(CheckpointError, match="complex64"):
        from cbop_torchrl.trainers.checkpoint import load_policy

        load_policy(tmp_path / "policy.pt")
    assert load_checkpoint(tmp_path / "policy.pt")["actor"][name].is_complex()


def test_a_swapped_fqe_result_is_trained_again(tmp_path: Path) -> None:
    """The reported case: another entry's FQE ``result.pt`` (here: another seed's) would have
    changed the scores silently."""
    from cbop_torchrl.config import FQEConfig
    from cbop_torchrl.trainers.pretrain import load_or_train_fqe

    (data, info), _ = _two_datasets(tmp_path)
    config = FQEConfig(steps=4, batch_size=8, checkpoint_interval=2)

    def fit(seed: int) -> tuple[dict, bool]:
        return load_or_train_fqe(data, info.fingerprint, info.obs_dim, info.action_dim, [8], 2,
                                 0.99, config, seed, progress=False)  # fmt: skip

    first, _ = fit(0)
    [own] = cache_dir("pretrain", "fqe").glob("*/result.pt")
    fit(1)
    [other] = [p for p in cache_dir("pretrain", "fqe").glob("*/result.pt") if p != own]
    shutil.copy(other, own)
    with pytest.warns(UserWarning, match="belongs to another cache entry"):
        again, cached = fit(0)
    assert not cached
    assert all(torch.equal(again[k], first[k]) for k in first)  # trained again: the same


def test_a_read_only_run_keeps_its_fits_in_the_cache(
    trained_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run on a read-only file system (here: one ``os.access`` calls unwritable) gets no
    ``selection_fqe``; its fit is cached in the package's cache, and select-psi succeeds."""
    from cbop_torchrl.apps import select_psi

    sweep = tmp_path / "sweep"
    shutil.copytree(trained_run["run"], sweep / "run")
    shutil.rmtree(sweep / "run" / "selection_fqe", ignore_errors=True)  # another test's fits
    real_access = os.access

    def read_only(path, mode, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).startswith(str(sweep)) and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", read_only)
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))
    assert select_psi.main([f"sweep_dir={sweep}", "steps=4", "progress=false"]) == 0
    assert not (sweep / "run" / "selection_fqe").exists()
    assert list((tmp_path / "cache" / "selection_fqe").glob("*/result.pt"))


def test_mujoco_writes_no_log_into_the_working_directory(tmp_path: Path) -> None:
    script = (
        "from cbop_torchrl.runtime import keep_mujoco_log_out_of_cwd\n"
        "keep_mujoco_log_out_of_cwd()\n"
        "import mujoco\n"
        "for _ in range(3):\n"
        '    mujoco.MjModel.from_xml_string(\'<mujoco><compiler settotalmass="1"/><worldbody>'
        '<body><freejoint/><geom size=".1"/></body></worldbody></mujoco>\')\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # the warning reaches the console once, as a Python warning, not once per model load
    assert (done.stdout + done.stderr).count("settotalmass") == 1, done.stdout + done.stderr
    assert "MuJoCoWarning" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
