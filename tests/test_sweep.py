"""Sweeps: the launcher and sweep configs compose, and a local multirun of two tiny runs.

The launcher configs need the plugins of the ``cluster`` extra
(hydra-submitit-launcher, hydra-ray-launcher, hydra-joblib-launcher). The
local sweep runs ``scripts/cbop.py -m`` with the ``local_parallel`` (joblib)
launcher, two worker processes, on a generated D4RL-format file with the debug
preset cut down further (a few steps per stage), then relaunches one job with
Hydra's basic launcher to check that it lands in the same run directory
whichever launcher started it, and continues from its checkpoint.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from d4rl_files import pipeline_workspace
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from inprocess import run_program

from cbop_torchrl.apps import select_psi as select_psi_program
from cbop_torchrl.cli import register_schemas
from cbop_torchrl.registry import d4rl_ids
from cbop_torchrl.sweeps import SweepError, find_runs, read_overrides, read_run

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "cbop_torchrl" / "configs"
SCRIPT = ROOT / "scripts" / "cbop.py"

select_psi = select_psi_program.main


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """select_psi threads= and the FQE test set torch's global thread count; put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


TINY = [
    "preset=debug",
    "seed=0",
    "train.epochs=1",
    "train.steps_per_epoch=6",
    "train.checkpoint_interval=3",
    "bc.steps=4",
    "fqe.steps=4",
    "eval.episodes=1",
    "eval.max_steps=5",
    "eval.interval=0",
    "estimator.rollout_dtype=float32",
    "progress=false",
]
"""The debug preset cut to a few steps per stage (the tests' time budget); float32 rollouts
(auto's bf16 timing costs ~5 s a run)."""


def compose_config(*overrides: str):
    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def sweep_jobs(params: dict) -> list[dict[str, str]]:
    """The jobs Hydra's basic sweeper makes of ``hydra.sweeper.params``."""
    parser = OverridesParser.create()
    overrides = parser.parse_overrides([f"{key}={value}" for key, value in params.items()])
    batches = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    return [dict(item.split("=", 1) for item in job) for batch in batches for job in batch]


def test_slurm_launcher_config_composes_into_an_sbatch_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import submitit
    from submitit.slurm.slurm import SlurmExecutor

    # submitit refuses to build a Slurm executor where `srun` is missing; this machine has none.
    monkeypatch.setattr(SlurmExecutor, "affinity", staticmethod(lambda: 1))

    cfg = compose_config("hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}")
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg._target_.endswith("submitit_launcher.SlurmLauncher")
    launcher = instantiate(launcher_cfg)
    params = dict(launcher.params)
    assert params["gpus_per_node"] == 1 and params["max_num_timeout"] > 0

    # What SlurmLauncher.launch does with these parameters, up to the sbatch file.
    executor = submitit.AutoExecutor(
        folder=tmp_path / "submitit", cluster="slurm", slurm_max_num_timeout=20
    )
    base = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb"}
    base |= {"nodes", "name", "stderr_to_stdout"}
    params.pop("submitit_folder")
    params.pop("max_num_timeout")
    executor.update_parameters(
        **{key if key in base else f"slurm_{key}": value for key, value in params.items()}
    )
    script = executor._executor._make_submission_file_text("python run.py", "uid")
    for flag in ("--gpus-per-node=1", "--requeue", "--signal=USR2@180", "--mem=16GB"):
        assert f"#SBATCH {flag}" in script, flag


def test_ray_launcher_config_composes() -> None:
    cfg = compose_config("hydra/launcher=ray_cluster")
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "RayLauncher"
    assert launcher.ray_cfg.remote.num_gpus == 1
    assert launcher.ray_cfg.remote.max_retries > 0
    assert launcher.ray_cfg.init.address == "auto"


def test_local_parallel_launcher_config_composes() -> None:
    cfg = compose_config("hydra/launcher=local_parallel")
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "JoblibLauncher"
    assert cfg.hydra.launcher.n_jobs == 2


def test_paper_grid_sweep_is_the_papers_grid_at_paper_settings() -> None:
    cfg = compose_config("+sweep=paper_grid")
    assert cfg.preset == "paper"
    jobs = sweep_jobs(cfg.hydra.sweeper.params)
    assert len(jobs) == 18 * 5 * 4
    paper_ids = {i for i in d4rl_ids() if not i.startswith("ant-")}  # the paper has no ant
    assert {job["env"] for job in jobs} == paper_ids
    assert {job["seed"] for job in jobs} == {"0", "1", "2", "3", "4"}
    assert {float(job["estimator.psi"]) for job in jobs} == {0.5, 2.0, 3.0, 5.0}
    assert len({tuple(sorted(job.items())) for job in jobs}) == len(jobs)


@pytest.mark.parametrize("name", ["paper_grid", "psi_grid"])
def test_sweep_configs_name_run_directories_like_the_main_config(name: str) -> None:
    main = yaml.safe_load((CONFIGS / "config.yaml").read_text())
    expected = main["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    assert "sweep" in expected
    cfg = compose_config(f"+sweep={name}")
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == expected


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two tiny runs (psi 0.5 and 5) by ``scripts/cbop.py -m +sweep=psi_grid``, in parallel."""
    workspace = pipeline_workspace(tmp_path_factory.mktemp("sweep"), episode_lengths=[60] * 6)
    root, dataset, env = workspace["root"], workspace["dataset"], workspace["env"]
    sweep_dir = root / "sweep"
    command = [
        sys.executable,
        str(SCRIPT),
        "-m",
        "+sweep=psi_grid",
        f"env={dataset}",
        f"hydra.sweep.dir={sweep_dir}",
        *TINY,
    ]
    parallel = ["hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2", "threads=1"]
    done = subprocess.run(
        [*command, *parallel, "estimator.psi=0.5,5"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in done.stdout + done.stderr  # the launcher that ran them
    return {
        "root": root,
        "dataset": dataset,
        "env": env,
        "sweep_dir": sweep_dir,
        "command": command,
    }


def finished_runs(sweep_dir: Path) -> list[dict]:
    """The ``results.json`` of every finished run under ``sweep_dir`` (:func:`find_runs`,
    :func:`read_run`), each with its ``run_dir``."""
    records = []
    for run_dir in find_runs(sweep_dir):
        _, results = read_run(run_dir)
        if results is not None:
            records.append({**results, "run_dir": str(run_dir)})
    return records


def test_local_sweep_gathers_one_results_file_per_run(tiny_sweep: dict) -> None:
    results = finished_runs(tiny_sweep["sweep_dir"])
    assert [record["settings"]["psi"] for record in results] == [0.5, 5.0]
    for record in results:
        run_dir = Path(record["run_dir"])
        assert run_dir.parent == tiny_sweep["sweep_dir"] / "hopper-medium-replay-tiny" / "debug"
        # the directory names the training overrides, not the sweep file or the launcher
        assert run_dir.name.startswith("bc.steps=4,estimator.psi=")
        assert "sweep" not in run_dir.name and ",seed=0," in run_dir.name
        assert record["dataset"] == "hopper-medium-replay-tiny" and record["seed"] == 0
        assert record["gradient_steps"] == 6 and record["resumed_from_step"] is None
        assert "+sweep=psi_grid" in read_overrides(run_dir)
        assert (run_dir / "policy.pt").is_file()
    assert find_runs(tiny_sweep["sweep_dir"]) == [Path(r["run_dir"]) for r in results]


def test_relaunched_job_continues_in_its_run_directory(tiny_sweep: dict) -> None:
    """A restarted job (same overrides, as after preemption) finds its checkpoint.

    The psi=5 job is made to look preempted after its last checkpoint and
    before its final evaluation (no results.json): the relaunch must land in
    the same directory and resume at that checkpoint, training nothing again.
    """
    sweep_dir = tiny_sweep["sweep_dir"]
    before = sorted(path.parent for path in sweep_dir.rglob("config.json"))
    (run_dir,) = [path for path in before if "estimator.psi=5," in path.name]
    (run_dir / "results.json").unlink()
    done = run_program(  # Hydra's basic launcher, in this process
        "cbop",
        [*tiny_sweep["command"][2:], "estimator.psi=5"],
        {"CBOP_TORCHRL_CACHE": tiny_sweep["env"]["CBOP_TORCHRL_CACHE"]},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.parent for path in sweep_dir.rglob("config.json")) == before
    results = {r["settings"]["psi"]: r for r in finished_runs(sweep_dir)}
    assert Path(results[5.0]["run_dir"]) == run_dir
    assert results[5.0]["resumed_from_step"] == 6  # the run's last checkpoint
    assert results[5.0]["gradient_steps_this_session"] == 0
    assert results[0.5]["resumed_from_step"] is None  # the other job was not touched
    assert read_overrides(run_dir)[-1].startswith("progress=")


def test_select_psi_on_the_sweep(tiny_sweep: dict, capsys: pytest.CaptureFixture) -> None:
    """FQE of the sweep's two trained policies; online scores come from results.json."""
    report = tiny_sweep["root"] / "selection.json"
    arguments = ["steps=20", "threads=1", "progress=false", f"json={report}"]
    assert select_psi([f"sweep_dir={tiny_sweep['sweep_dir']}", *arguments]) == 0
    out = capsys.readouterr().out
    assert "hopper-medium-replay-tiny" in out and "Spearman's rho" in out
    (ranking,) = json.loads(report.read_text())
    assert sorted(c["label"] for c in ranking["candidates"]) == [
        "estimator.psi=0.5",
        "estimator.psi=5.0",  # psi=5 on the command line; a float in the schema
    ]
    online = {
        r["run_dir"]: r["normalized_score_mean"] for r in finished_runs(tiny_sweep["sweep_dir"])
    }
    for candidate in ranking["candidates"]:
        (run,) = candidate["runs"]
        assert math.isfinite(run["fqe_value"]) and run["policy_step"] == 6
        assert run["online_score"] == online[run["run_dir"]]
        assert any((Path(run["run_dir"]) / "selection_fqe").rglob("result.pt"))


def test_finding_and_reading_runs_errors(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="does not exist"):
        find_runs(tmp_path / "missing")
    assert find_runs(tmp_path) == []
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "policy.pt").write_bytes(b"")
    assert find_runs(tmp_path) == [run] and read_run(run) == ({}, None)
    (run / "results.json").write_text("{not json")
    with pytest.raises(SweepError, match="cannot read"):
        read_run(run)


def test_a_folder_of_links_to_runs_is_searched_like_the_runs(tmp_path: Path) -> None:
    """Runs kept elsewhere and gathered by symbolic links (say, one candidate folder per psi
    for the offline selection) are found; a link back up the tree does not loop."""
    for name in ("a", "b"):
        run = tmp_path / "kept" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
        (run / "policy.pt").write_bytes(b"")
        (run / "results.json").write_text(json.dumps({"seed": name}))
    view = tmp_path / "view"
    view.mkdir()
    for name in ("a", "b"):
        (view / name).symlink_to(tmp_path / "kept" / name, target_is_directory=True)
    (view / "a" / "up").symlink_to(view, target_is_directory=True)  # a cycle
    assert find_runs(view) == [view / "a", view / "b"]
    assert [record["seed"] for record in finished_runs(view)] == ["a", "b"]
