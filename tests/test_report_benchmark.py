"""The learning benchmark driver's plan: order, skipping finished runs, stale summaries."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cbop_torchrl.evaluation import summaries as summary_files

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("no_repository_copies")


def load_driver():
    spec = importlib.util.spec_from_file_location("learning", ROOT / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_provenance(cache: Path, sha256: str = "aaa") -> dict:
    """The generated hopper set's provenance file in ``cache``, as the driver reads it."""
    generated = cache / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    provenance = {"command": "python scripts/collect.py", "data_key": "k1", "sha256": sha256}
    (generated / "hopper-medium-replay-gen.provenance.json").write_text(json.dumps(provenance))
    return provenance


def write_summary(results: Path, variant: str, **fields: object) -> Path:
    """A stored hopper seed-0 summary of ``variant`` with ``fields``, as the driver reads it."""
    path = results / "hopper-medium-replay-gen" / variant / "seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(fields))
    return path


def write_run(run_dir: Path, epochs: int) -> None:
    """A run directory started with ``epochs`` x 1,000 gradient steps (its ``config.json``)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(
        json.dumps({"train": {"epochs": epochs, "steps_per_epoch": 1000}})
    )


def plan_lines(capsys: pytest.CaptureFixture, driver, *args: str) -> list[str]:
    assert driver.main(["--dry-run", *args]) == 0
    # "[bench] <state> <dataset> <variant> seed <k>..." -> [state, dataset, variant, k]
    return [
        [*line.split()[1:4], line.split()[5].rstrip(":")]
        for line in capsys.readouterr().out.splitlines()
    ]


def test_plan_order_skip_and_stale(
    tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    driver = load_driver()
    provenance = write_provenance(isolated_cache)
    results = tmp_path / "results"
    args = ("--results", str(results), "--seeds", "0", "1", "--algos", "cbop", "bc", "iql")

    lines = plan_lines(capsys, driver, *args)
    assert [line[2] for line in lines] == ["cbop", "bc", "iql"] * 2  # seed by seed, CBOP first
    assert [line[-1] for line in lines] == ["0"] * 3 + ["1"] * 3
    assert {line[0] for line in lines} == {"start"}

    write_summary(results, "bc", dataset_provenance=provenance)
    lines = plan_lines(capsys, driver, *args)
    assert lines[1] == ["done", "hopper-medium-replay-gen", "bc", "0"]
    assert sum(line[0] == "start" for line in lines) == 5

    write_provenance(isolated_cache, sha256="bbb")  # the dataset was regenerated: rerun
    assert driver.main(["--dry-run", *args]) == 0
    printed = capsys.readouterr().out
    assert "stale" in printed and printed.count("start ") == 6
    assert (results / "hopper-medium-replay-gen" / "bc" / "seed0.json").is_file()  # dry run


def test_an_earlier_files_summary_is_kept_beside_the_rerun(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """The rerun on a new file does not overwrite the earlier file's summary: it moves to
    ``<variant>-file-<sha12>/`` and rows.json keeps that row with all its seeds."""
    driver = load_driver()
    write_provenance(isolated_cache, sha256="b" * 64)
    results = tmp_path / "results"
    curve = [[step * 1000, float(step)] for step in range(12)]
    for seed in (0, 1):
        path = results / "hopper-medium-replay-gen" / "bc" / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {"dataset": "hopper-medium-replay-gen", "variant": "bc", "seed": seed}
        summary.update(curve=curve, dataset_provenance={"sha256": "a" * 64})
        path.write_text(json.dumps(summary))
    path = results / "hopper-medium-replay-gen" / "bc" / "seed0.json"
    kept = driver.keep_earlier_file_summary(path, json.loads(path.read_text()))
    assert kept == results / "hopper-medium-replay-gen" / f"bc-file-{'a' * 12}" / "seed0.json"
    assert not path.exists() and json.loads(kept.read_text())["seed"] == 0
    # The rerun's summary on the current file takes the old path.
    rerun = {"dataset": "hopper-medium-replay-gen", "variant": "bc", "seed": 0, "curve": curve}
    path.write_text(json.dumps({**rerun, "dataset_provenance": {"sha256": "b" * 64}}))
    rows = json.loads(driver.write_rows(results, "hopper-medium-replay-gen").read_text())
    found = {(row["variant"], row["dataset_sha256"], tuple(row["seeds"])) for row in rows["rows"]}
    assert found == {("bc", "a" * 12, (0, 1)), ("bc", "b" * 12, (0,))}


def test_a_run_made_on_the_current_file_is_kept_beside_a_stale_summary(tmp_path: Path) -> None:
    """A run finished on the current file whose summary was never written is not started over."""
    driver = load_driver()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    provenance = {"sha256": "new"}
    assert not driver.run_on_current_file(run_dir, provenance)  # no data record: made elsewhere
    (run_dir / "data.json").write_text(json.dumps({"content": "old"}))
    assert not driver.run_on_current_file(run_dir, provenance)
    (run_dir / "data.json").write_text(json.dumps({"content": "new"}))
    assert driver.run_on_current_file(run_dir, provenance)
    assert not driver.run_on_current_file(run_dir, {})  # no provenance: nothing to compare
    (run_dir / "data.json").write_text("{damaged")
    assert not driver.run_on_current_file(run_dir, provenance)


def test_another_preset_keeps_its_runs_and_summaries_apart(
    tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--preset paper`` neither counts the CPU preset's summary as done nor replaces it."""
    driver = load_driver()
    provenance = write_provenance(isolated_cache)
    results, runs = tmp_path / "results", tmp_path / "runs"
    cpu_summary = write_summary(
        results, "cbop", dataset_provenance=provenance, gradient_steps=20_000, preset="cpu"
    )
    args = ("--results", str(results), "--runs", str(runs), "--seeds", "0", "--algos", "cbop")

    assert plan_lines(capsys, driver, *args)[0][:3] == ["done", "hopper-medium-replay-gen", "cbop"]
    assert driver.main(["--dry-run", *args, "--preset", "paper", "--label", "60k"]) == 0
    printed = capsys.readouterr().out
    assert "stale" not in printed and "start    hopper-medium-replay-gen cbop-paper-60k" in printed
    assert str(runs / "hopper-medium-replay-gen" / "k1" / "paper" / "cbop-paper-60k") in printed
    assert driver.stale_reason(json.loads(cpu_summary.read_text()), provenance, 20_000, "paper")


def test_baselines_get_the_gradient_steps_of_cbops_whole_pipeline(tmp_path: Path) -> None:
    driver = load_driver()
    args = driver.parse_args(["--epochs", "20", "bc.steps=3000"])
    cpu_fqe_steps = 5000  # configs/preset/cpu.yaml
    assert driver.variant_steps("cbop", args) == 20_000
    assert driver.variant_steps("cbop-map", args) == 20_000
    assert driver.variant_steps("iql", args) == 20_000 + 3000 + cpu_fqe_steps
    command = driver.run_command("iql", tmp_path / "d.hdf5", 0, "cpu", tmp_path / "run", args)
    assert "train.epochs=28" in command and "train.steps_per_epoch=1000" in command
    uneven = driver.parse_args(["--epochs", "20", "--steps-per-epoch", "3000"])  # iql: 70,000
    with pytest.raises(driver.BenchmarkInputError, match="not a multiple of --steps-per-epoch"):
        driver.run_command("iql", tmp_path / "d.hdf5", 0, "cpu", tmp_path / "run", uneven)


def test_a_larger_budget_extends_a_run_and_a_smaller_one_restarts_it(
    tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    driver = load_driver()
    provenance = write_provenance(isolated_cache)
    results, runs = tmp_path / "results", tmp_path / "runs"
    run_dir = runs / "hopper-medium-replay-gen" / "k1" / "cpu" / "cbop" / "seed0"
    write_run(run_dir, epochs=20)
    write_summary(results, "cbop", dataset_provenance=provenance, gradient_steps=20_000)
    args = ("--results", str(results), "--runs", str(runs), "--seeds", "0", "--algos", "cbop")

    def state(epochs: str) -> list[str]:
        assert driver.main(["--dry-run", *args, "--epochs", epochs]) == 0
        printed = capsys.readouterr().out.splitlines()
        return [line.split()[1] for line in printed if " stale " not in line]

    assert state("20") == ["done"]
    assert state("60") == ["extend"]  # the summary is stale; the run continues from 20k
    assert state("10") == ["restart"]
    assert run_dir.is_dir()  # a dry run moves nothing


def test_a_labelled_longer_run_continues_a_copy_of_the_shorter_one(
    tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--label 60k``: a new run directory and summary; the 20k run is copied, not moved."""
    driver = load_driver()
    write_provenance(isolated_cache)
    runs = tmp_path / "runs"
    here = runs / "hopper-medium-replay-gen" / "k1" / "cpu"
    base = here / "cbop" / "seed0"
    write_run(base, epochs=20)
    (base / "checkpoint.pt").write_bytes(b"20k")
    (base / ".run.lock").write_text("pid 1 on elsewhere")
    args = ["--runs", str(runs), "--results", str(tmp_path / "results"), "--seeds", "0"]

    lines = plan_lines(capsys, driver, *args, "--algos", "cbop", "--epochs", "60", "--label", "60k")
    assert lines == [["continue", "hopper-medium-replay-gen", "cbop-60k", "0"]]
    assert not (here / "cbop-60k").exists()  # a dry run copies nothing
    # A labelled budget not longer than the existing run, or a variant without a run: no copy.
    for epochs in ("10", "20"):
        lines = plan_lines(
            capsys, driver, *args, "--algos", "cbop", "--epochs", epochs, "--label", "x"
        )
        assert lines[0][0] == "start"
    lines = plan_lines(capsys, driver, *args, "--algos", "cql", "--epochs", "60", "--label", "60k")
    assert lines[0][0] == "start"

    run_dir = here / "cbop-60k" / "seed0"
    assert driver.continuation_source(run_dir, base, 60_000) == base
    driver.copy_run(base, run_dir)  # what a real run does before it starts the copy
    assert driver.continuation_source(run_dir, base, 60_000) is None  # exists: resume it
    assert (run_dir / "checkpoint.pt").read_bytes() == b"20k" and not (
        run_dir / ".run.lock"
    ).exists()
    lines = plan_lines(capsys, driver, *args, "--algos", "cbop", "--epochs", "60", "--label", "60k")
    assert lines == [["extend", "hopper-medium-replay-gen", "cbop-60k", "0"]]
    assert (base / "checkpoint.pt").is_file()  # the 20k run stays


def test_a_summary_or_run_made_with_other_cbop_settings_no_longer_counts(
    tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """A preset change (here its critics' widths) makes the old CBOP rows stale, not done."""
    driver = load_driver()
    provenance = write_provenance(isolated_cache)
    results, runs = tmp_path / "results", tmp_path / "runs"
    expected = driver.expected_settings("cbop", "cpu", [])
    old_settings = {**expected, "critic_hidden_sizes": [7, 7], "psi": 2.0}
    old_summary = {
        "dataset_provenance": provenance,
        "gradient_steps": 20_000,
        "preset": "cpu",
        "diagnostics": {"settings": old_settings},
    }
    write_summary(results, "cbop", **old_summary)
    args = ("--results", str(results), "--runs", str(runs), "--seeds", "0", "--algos", "cbop")
    assert driver.main(["--dry-run", *args]) == 0
    printed = capsys.readouterr().out
    assert f"critic_hidden_sizes: [7, 7] -> {expected['critic_hidden_sizes']}" in printed

    # The same row under a label that asks for those settings counts as done.
    write_summary(results, "cbop-old", **old_summary)
    lines = plan_lines(capsys, driver, *args, "--label", "old", "agent.critic_hidden_sizes=[7,7]")
    assert lines[0][:3] == ["done", "hopper-medium-replay-gen", "cbop-old"]

    # A summary from before the widths were recorded had critics as wide as its actor.
    legacy = {key: value for key, value in old_settings.items() if "hidden" not in key}
    assert driver.settings_differences(legacy, expected) == (
        []
        if expected["critic_hidden_sizes"] == expected["actor_hidden_sizes"]
        else [
            f"critic_hidden_sizes: {expected['actor_hidden_sizes']} -> "
            f"{expected['critic_hidden_sizes']}"
        ]
    )

    # An unfinished run with other settings cannot be resumed: it is moved aside.
    run_dir = runs / "hopper-medium-replay-gen" / "k1" / "cpu" / "cbop" / "seed0"
    run_dir.mkdir(parents=True)
    config = {
        "agent": {"hidden_sizes": [256, 256], "critic_hidden_sizes": [7, 7], "num_qvalue_nets": 5},
        "dynamics": {"num_elites": 5},
        "estimator": {"horizon": 5, "psi": 2.0},
        "train": {"batch_size": 128, "epochs": 20, "steps_per_epoch": 1000},
    }
    (run_dir / "config.json").write_text(json.dumps(config))
    differences = driver.run_settings_differences(run_dir, expected)
    assert differences and differences[0].startswith("critic_hidden_sizes: [7, 7]")
    assert plan_lines(capsys, driver, *args)[-1][0] == "restart"  # after the "stale" line


def test_a_summary_made_with_another_dynamics_cap_no_longer_counts(isolated_cache: Path) -> None:
    """The dynamics model's epoch cap is one of the settings; older summaries did not record
    it, so it is read from their command's override or their preset as it was then."""
    driver = load_driver()
    provenance = write_provenance(isolated_cache)
    preset_cap = driver.expected_settings("cbop", "cpu", [])
    preset_file = ROOT / "cbop_torchrl" / "configs" / "preset" / "cpu.yaml"
    preset_yaml = OmegaConf.load(preset_file)
    assert preset_cap["dynamics_max_epochs"] == preset_yaml.dynamics.max_epochs
    capped_7 = {**preset_cap, "dynamics_max_epochs": 7}  # no preset's cap
    uncapped = {**preset_cap, "dynamics_max_epochs": driver.dynamics_cap(None)}
    assert uncapped["dynamics_max_epochs"] == "patience"

    def summary(command: str, **settings: object) -> dict:
        recorded = {**preset_cap, **settings}
        return {"dataset_provenance": provenance, "gradient_steps": 20_000, "preset": "cpu",
                "command": command, "diagnostics": {"settings": recorded}}  # fmt: skip

    def stale(made: dict, expected: dict) -> str | None:
        return driver.stale_reason(made, provenance, 20_000, "cpu", expected)

    recorded_7 = summary("python scripts/cbop.py preset=cpu", dynamics_max_epochs=7)
    assert stale(recorded_7, capped_7) is None
    why = stale(recorded_7, preset_cap)
    assert why and f"dynamics_max_epochs: 7 -> {preset_cap['dynamics_max_epochs']}" in why
    assert stale(summary("cbop.py", dynamics_max_epochs=None), uncapped) is None

    def legacy(command: str) -> dict:
        made = summary(command)
        del made["diagnostics"]["settings"]["dynamics_max_epochs"]
        return made

    # Before the cap was recorded: the command's override, else the CPU preset's 15 then.
    assert stale(legacy("cbop.py preset=cpu seed=1 dynamics.max_epochs=7"), capped_7) is None
    assert stale(legacy("cbop.py preset=cpu seed=1 dynamics.max_epochs=7"), preset_cap) == why
    assert "dynamics_max_epochs: 15 -> 7" in stale(legacy("cbop.py preset=cpu"), capped_7)


def test_rows_keep_an_earlier_files_runs_apart_from_the_current_files(
    tmp_path: Path, isolated_cache: Path
) -> None:
    driver = load_driver()
    write_provenance(isolated_cache, sha256="b" * 64)
    results = tmp_path / "results"
    curve = [[step * 1000, float(step)] for step in range(12)]
    for sha, variant, seed in (("a", "bc", 0), ("b", "bc", 1), ("b", "cql", 0)):
        path = results / "hopper-medium-replay-gen" / variant / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {"dataset": "hopper-medium-replay-gen", "variant": variant, "seed": seed}
        summary.update(curve=curve, dataset_provenance={"sha256": sha * 64})
        path.write_text(json.dumps(summary))
    rows = json.loads(driver.write_rows(results, "hopper-medium-replay-gen").read_text())
    assert rows["sha256"] == "b" * 64
    found = {(row["variant"], row["dataset_sha256"], tuple(row["seeds"])) for row in rows["rows"]}
    assert found == {("bc", "a" * 12, (0,)), ("bc", "b" * 12, (1,)), ("cql", "b" * 12, (0,))}


def test_rows_name_the_reports_current_file_when_the_data_is_not_here(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """Without the file on this machine, rows.json names the file the report calls current
    (the most recently finished summary's), not the one most summaries were made on."""
    driver = load_driver()
    results = tmp_path / "results"
    curve = [[step * 1000, float(step)] for step in range(12)]
    runs = (
        ("a", "bc", 0, "2026-11-01"),
        ("a", "bc", 1, "2026-11-02"),
        ("b", "cql", 0, "2026-11-03"),
    )
    for sha, variant, seed, finished in runs:
        path = results / "hopper-medium-replay-gen" / variant / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {"dataset": "hopper-medium-replay-gen", "variant": variant, "seed": seed}
        summary.update(curve=curve, dataset_provenance={"sha256": sha * 64}, finished_utc=finished)
        path.write_text(json.dumps(summary))
    rows = json.loads(driver.write_rows(results, "hopper-medium-replay-gen").read_text())
    assert rows["sha256"] == "b" * 64
    summaries = [json.loads(p.read_text()) for p in results.glob("*/*/seed*.json")]
    assert summary_files.current_files(summaries) == {"hopper-medium-replay-gen": "b" * 12}
