"""The package installed from the offline bundle works outside the checkout.

One install for every test here: ``python -m tools.bundle --with-torch`` builds this
checkout's wheel and every wheel it needs (torch at the version this venv has; building
reaches the package index by name, and pip's cache makes a second build fast), and a fresh
venv installs them with ``--no-index`` and no pip configuration, so nothing but the bundle
is seen. From an empty directory: the wheel holds the configs and the console scripts;
``--cfg job`` composes the paper preset for a D4RL id, every console script is a Hydra app
(``--help``, ``--cfg job``, bash completion), ``python -m cbop_torchrl`` lists and runs
them, an error's suggested command names the installed script, and the installed
``cbop-train`` trains the debug preset end to end. The bundle's dependency walk, its
refusals and a bundle for another Python are in ``tests/test_bundle.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import torch

from cbop_torchrl.apps import COMMANDS

ROOT = Path(__file__).resolve().parents[1]  # tools/ is run from the checkout's root
TORCH_SPEC = f"torch=={torch.__version__.split('+')[0]}"
pytestmark = pytest.mark.install


def offline_env(**extra: str) -> dict[str, str]:
    """This environment without any pip configuration: only the bundle can be found."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def test_pyproject_registers_every_program() -> None:
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]\n")[1]
    lines = section.split("\n\n")[0].splitlines()  # name = "module:function", up to a blank line
    scripts = {name.strip(): target.strip().strip('"') for name, target in
               (line.split("=", 1) for line in lines)}  # fmt: skip
    expected = {c.name: f"cbop_torchrl.apps:{c.name.replace('-', '_')}" for c in COMMANDS}
    assert scripts == expected
    assert {c.script for c in COMMANDS} == {
        f"scripts/{p.name}" for p in (ROOT / "scripts").glob("*.py") if p.name != "bench.py"
    }
    for command in COMMANDS:  # each script is a thin wrapper over its program
        text = (ROOT / command.script).read_text()
        assert f'launch("{command.module}")' in text and len(text.splitlines()) < 25


def test_configs_exist_once() -> None:
    assert not (ROOT / "configs").exists()
    assert (ROOT / "cbop_torchrl" / "configs" / "config.yaml").is_file()


HELP_AND_CFG = """
import contextlib, io, json, os, sys
from importlib.metadata import distribution

import cbop_torchrl
from cbop_torchrl.__main__ import main as module_main
from cbop_torchrl.runtime import program_command

report = {"package": cbop_torchrl.__file__, "runs": {},
          "program_command": program_command("cbop-collect")}
scripts = {ep.name: ep for ep in distribution("cbop-torchrl").entry_points
           if ep.group == "console_scripts"}
calls = [(name, ["--help"]) for name in sorted(scripts)]
calls.append(("cbop-train", ["env=hopper-medium-v2", "--cfg", "job"]))
calls.append(("cbop-select-psi", ["sweep_dir=multirun", "steps=5", "--cfg", "job"]))
calls.append(("cbop-report", ["paths=[runs/a,runs/b]", "--cfg", "job"]))
calls += [(name, ["--shell-completion", "install=bash"]) for name in sorted(scripts)]
# what bash passes while completing (COMP_LINE up to the cursor) -> the word Hydra offers
completions = {"cbop-train": "preset=d", "cbop-select-psi": "qvalue", "cbop-report": "analy"}
calls += [(name, ["--shell-completion", "query=bash"]) for name in completions]
calls.append(("cbop-collect", ["env=swimmer", "progress=false"]))  # refused: names the fix
calls.append(("python -m cbop_torchrl", []))
calls.append(("python -m cbop_torchrl", ["cbop-report", "paths=x", "--cfg", "job"]))
for name, args in calls:
    os.environ["COMP_LINE"] = f"{name} {completions.get(name, '')}"
    os.environ["COMP_POINT"] = str(len(os.environ["COMP_LINE"]))
    sys.argv = [name, *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if name.startswith("python"):
                code = module_main(args)
            else:
                code = scripts[name].load()()
        except SystemExit as exit_:
            code = exit_.code
    report["runs"][" ".join([name, *args])] = {
        "code": code or 0, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """``(bundle folder, its bundle.json, what the build printed)``."""
    dest = tmp_path_factory.mktemp("bundle") / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bundle", "--dest", str(dest),
         "--with-torch", "--torch", TORCH_SPEC],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dest, json.loads((dest / "bundle.json").read_text()), done.stdout


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(the package's wheel, bin directory of the venv the bundle is installed in)``."""
    dest, _, _ = built
    env_dir = tmp_path_factory.mktemp("install") / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-compile",
               "--find-links", str(dest), "cbop-torchrl"]  # fmt: skip
    done = subprocess.run(install, env=offline_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = dest.glob("cbop_torchrl-*.whl")
    return wheel, env_dir / "bin"


def run_env(tmp_path: Path) -> dict[str, str]:
    """An offline environment for the installed programs: no PYTHONPATH, a private cache."""
    env = offline_env(CBOP_TORCHRL_CACHE=str(tmp_path / "cache"), WANDB_MODE="offline")
    env.pop("PYTHONPATH", None)
    return env


def test_bundle_holds_the_package_torch_and_its_requirements(built) -> None:
    dest, manifest, printed = built
    names = {name.split("-")[0].lower() for name in manifest["files"]}
    assert {"cbop_torchrl", "torch", "torchrl", "tensordict", "hydra_core", "mujoco"} <= names
    # Hydra's parser is published only as a source archive: built here into a pure wheel.
    assert any(n.startswith("antlr4") and n.endswith("none-any.whl") for n in manifest["files"])
    on_disk = {p.name: p.stat().st_size for p in dest.glob("*.whl")}
    assert manifest["files"].items() <= on_disk.items()
    assert manifest["total_bytes"] == sum(manifest["files"].values())
    assert f"{manifest['total_bytes'] / 2**20:.1f} MiB" in printed and "largest: " in printed
    assert "pip install --no-index --find-links" in printed


def test_the_wheel_holds_the_configs_and_the_console_scripts(installed) -> None:
    wheel, bin_dir = installed
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_text = archive.read(entry_points).decode()
    configs = ROOT / "cbop_torchrl" / "configs"
    expected = {f"cbop_torchrl/configs/{p.relative_to(configs)}" for p in configs.rglob("*.yaml")}
    assert expected and expected <= names
    assert "cbop_torchrl/assets/hopper-demo-medium-replay-gen.hdf5" in names
    for command in COMMANDS:
        assert f"{command.name} = cbop_torchrl.apps:" in entry_text
        assert (bin_dir / command.name).is_file()


def test_console_scripts_run_outside_the_checkout(installed, tmp_path: Path) -> None:
    _, bin_dir = installed
    empty = tmp_path / "empty"
    empty.mkdir()
    env = run_env(tmp_path)

    probe = subprocess.run(
        [str(bin_dir / "python"), "-c", HELP_AND_CFG],
        cwd=empty, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    package = Path(report["package"]).resolve()
    assert bin_dir.parent in package.parents and ROOT not in package.parents
    runs = report["runs"]
    assert len(runs) == 2 * len(COMMANDS) + 3 + 3 + 1 + 2
    for command in COMMANDS:  # every program is a Hydra app: --help, --cfg, completion
        result = runs[f"{command.name} --help"]
        assert result["code"] == 0, (command.name, result)
        assert "Powered by Hydra" in result["out"] and "== Config ==" in result["out"]
        completion = runs[f"{command.name} --shell-completion install=bash"]
        assert completion["code"] == 0, (command.name, completion)
        assert "complete -o nospace -o default -F" in completion["out"]
        assert completion["out"].rstrip().endswith(f"hydra_bash_completion {command.name}")
    job = runs["cbop-train env=hopper-medium-v2 --cfg job"]
    assert job["code"] == 0 and "preset: paper" in job["out"]
    assert "env: hopper-medium-v2" in job["out"]
    job = runs["cbop-select-psi sweep_dir=multirun steps=5 --cfg job"]
    assert job["code"] == 0 and "sweep_dir: multirun\nsteps: 5\n" in job["out"]
    job = runs["cbop-report paths=[runs/a,runs/b] --cfg job"]
    assert job["code"] == 0 and "paths:\n- runs/a\n- runs/b\nout: report\n" in job["out"]
    for name, word in (("cbop-train", "preset=debug"), ("cbop-select-psi", "qvalue_nets="),
                       ("cbop-report", "analysis=")):  # fmt: skip
        query = runs[f"{name} --shell-completion query=bash"]
        assert query["code"] == 0 and query["out"].split() == [word], (name, query)
    # an error's suggestion names the installed console script (there is no scripts/ here)
    script = str(bin_dir / "cbop-collect")  # the venv is not activated: its full path
    assert report["program_command"] == script
    refused = runs["cbop-collect env=swimmer progress=false"]
    assert refused["code"] == 2 and "Traceback" not in refused["err"]
    assert f"`{script} env=swimmer task.gym_id=Swimmer-v4 kind=random`" in refused["err"]
    overview = runs["python -m cbop_torchrl"]
    assert overview["code"] == 0 and all(c.name in overview["out"] for c in COMMANDS)
    job = runs["python -m cbop_torchrl cbop-report paths=x --cfg job"]
    assert job["code"] == 0 and "paths: x\n" in job["out"]
    assert list(empty.iterdir()) == []  # --help, --cfg, -sc and the refusal wrote nothing


def test_the_installed_cbop_train_trains_the_debug_preset(installed, tmp_path: Path) -> None:
    _, bin_dir = installed
    empty = tmp_path / "empty"
    empty.mkdir()
    env = run_env(tmp_path)
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import cbop_torchrl; print(cbop_torchrl.__file__)"],
        cwd=empty, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent)  # the bundle's copy
    train = subprocess.run(
        [str(bin_dir / "cbop-train"), "preset=debug", "progress=false"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    assert "normalized score" in train.stdout
    (results_path,) = empty.rglob("results.json")
    assert results_path == empty / "runs" / "demo" / "debug" / "default" / "results.json"
    results = json.loads(results_path.read_text())
    assert results["preset"] == "debug" and results["gradient_steps"] == 40
    assert str(results_path) in train.stdout
    assert (results_path.parent / "policy.pt2").is_file()
