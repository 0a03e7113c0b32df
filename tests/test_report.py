"""The report command on two tiny debug CBOP runs, and the report's building blocks.

Two ``scripts/cbop.py preset=debug`` runs (seeds 0 and 1, one Hydra multirun
process) on a small generated D4RL-format file feed ``scripts/report.py``
(``paths=[...] out=...``);
the tests check the files it writes and that the committed-summary route
(``summarize_run`` -> JSON -> report) gives the same table.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5

from cbop_torchrl.evaluation.analysis import rollout_from_observations, value_var_share_histograms
from cbop_torchrl.evaluation.figures import variant_colours
from cbop_torchrl.evaluation.report import (
    conservatism_rows,
    dataset_markdown,
    goal_check,
    headline_markdown,
    markdown_table,
    rliable_aggregates,
    score_rows,
    write_report,
)
from cbop_torchrl.evaluation.summaries import (
    SUMMARY_FORMAT,
    ReportError,
    current_files,
    final_window_score,
    load_summaries,
    read_scalar_curves,
    summarize_run,
    variant_name,
)

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG"


@pytest.fixture(scope="module")
def debug_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("report")
    dataset = write_d4rl_hdf5(
        root / "hopper-medium-replay-tiny.hdf5",
        episode_lengths=[120] * 6,
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
    )
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(root / "cache")}
    sweep = root / "sweep"
    subprocess.run(
        [
            sys.executable, str(ROOT / "scripts" / "cbop.py"), "-m", "preset=debug",
            f"env={dataset}", "seed=0,1", "progress=false", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=seed${seed}",
        ],
        cwd=root, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return {"root": root, "env": env, "runs": [sweep / "seed0", sweep / "seed1"]}


def report(debug_runs: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), *args, "rliable_reps=100"],
        cwd=debug_runs["root"], env=debug_runs["env"], capture_output=True, text=True,
    )  # fmt: skip


def test_report_command_writes_tables_and_figures(debug_runs: dict) -> None:
    out = debug_runs["root"] / "report"
    paths = ",".join(map(str, debug_runs["runs"]))
    done = report(debug_runs, f"paths=[{paths}]", f"out={out}")
    assert done.returncode == 0, done.stderr

    table = (out / "results.md").read_text()
    assert "| hopper-medium-replay-tiny | cbop | 2 (0 1) | 40 |" in table
    with open(out / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["variant"], r["num_seeds"]) for r in rows] == [("cbop", "2")]
    finals = []  # per run: the mean of its last 3 evaluations (the final one included)
    for run in debug_runs["runs"]:
        history = json.loads((run / "results.json").read_text())["eval_history"]
        last = [record["normalized_score_mean"] for record in history][-3:]
        finals.append(sum(last) / len(last))
    assert float(rows[0]["final_mean"]) == pytest.approx(sum(finals) / 2, abs=1e-6)

    for name in (
        "curves_hopper-medium-replay-tiny.png",
        "horizon_hopper-medium-replay-tiny.png",
        "rh_hopper-medium-replay-tiny_cbop.png",
        "share_hopper-medium-replay-tiny_cbop.png",
    ):
        assert (out / name).read_bytes()[:4] == PNG_MAGIC, name

    conservatism = (out / "conservatism.md").read_text()
    assert conservatism.count("| hopper-medium-replay-tiny | cbop |") == 2
    readme = (out / "README_results.md").read_text()
    assert "## Results" in readme and "curves_hopper-medium-replay-tiny.png" in readme
    try:
        import rliable  # noqa: F401
    except ImportError:
        assert "rliable is not installed" in done.stdout
    else:
        assert "IQM" in (out / "rliable.md").read_text()


def test_summaries_rebuild_the_same_table(
    debug_runs: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", debug_runs["env"]["CBOP_TORCHRL_CACHE"])
    folder = tmp_path / "results"
    for run in debug_runs["runs"]:
        summary = summarize_run(run)
        assert summary["summary_format"] == SUMMARY_FORMAT
        assert summary["variant"] == "cbop" and summary["gradient_steps"] == 40
        assert [point[0] for point in summary["curve"]] == [20, 40]
        assert summary["best_normalized_score"] >= summary["final_normalized_score"]
        assert "cbop/expected_horizon" in summary["train_curves"]
        sample = summary["analysis"]["rh_sample"]
        horizon, particles = summary["analysis"]["horizon"], summary["analysis"]["num_particles"]
        assert len(sample["returns"]) == horizon + 1
        assert len(sample["returns"][0]) == particles * 3  # K particles x M = 3 Q-members
        assert sum(sample["weights"]) == pytest.approx(1.0, abs=1e-4)
        target = folder / "tiny" / "cbop" / f"seed{summary['seed']}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(summary))
    from_runs = score_rows(load_summaries(debug_runs["runs"], analysis=False))
    from_summaries = load_summaries([folder])
    assert score_rows(from_summaries) == from_runs
    assert all("analysis" in s for s in from_summaries)  # stored: no checkpoint needed


def test_report_cli_rejects_a_missing_path(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cbop_torchrl.apps import report as module

    monkeypatch.chdir(tmp_path)
    assert module.main(["paths=no/such/dir"]) == 2
    assert "does not exist; paths= takes" in capsys.readouterr().err
    assert module.main(["paths={a: 1}"]) == 2
    assert "paths={'a': 1} must be a path or a list of paths" in capsys.readouterr().err
    assert module.main([]) == 2
    assert "paths must be given on the command line" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no report/, no Hydra files


def _summary(variant: str, seed: int, final: float, dataset: str = "d") -> dict:
    return {
        "summary_format": SUMMARY_FORMAT,
        "variant": variant,
        "dataset": dataset,
        "seed": seed,
        "final_normalized_score": final,
        "best_normalized_score": final + 1.0,
        "gradient_steps": 10,
        "curve": [[10, final]],
        "diagnostics": {},
    }


def test_report_sweeps_and_refuses_a_later_jobs_bad_value_and_the_old_syntax(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-m`` runs one report per job, keeping Hydra's files out of the working directory;
    a bad value in a job composed after an earlier one ran is still the project's error."""
    from cbop_torchrl.apps import report as module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))
    for variant, seed, final in (("cbop", 0, 50.0), ("bc", 0, 40.0)):
        target = tmp_path / "summaries" / variant / f"seed{seed}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(_summary(variant, seed, final)))

    assert (
        module.main(["-m", "paths=summaries", "out=a,b", "analysis=false", "rliable_reps=100"]) == 0
    )
    for out in ("a", "b"):
        table = (tmp_path / out / "results.md").read_text()
        assert "| d | cbop | 1 (0) | 10 | 50.0 ± 0.0 |" in table
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b", "cache", "summaries"]
    capsys.readouterr()

    # hydra.sweeper.max_batch_size=1: Hydra composes job 2 after job 1 has run
    argv = ["-m", "paths=summaries", "out=c", "analysis=false,abc", "rliable_reps=100"]
    assert module.main([*argv, "hydra.sweeper.max_batch_size=1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: analysis=abc: analysis must be true or false"), error
    assert "Traceback" not in error and error.count("\n") == 1
    assert (tmp_path / "c" / "results.md").is_file()  # job 1's report


def test_score_rows_mean_std_and_order() -> None:
    summaries = [_summary("bc", 0, 10.0), _summary("cbop", 1, 30.0), _summary("cbop", 0, 50.0)]
    rows = score_rows(summaries)
    assert [r["variant"] for r in rows] == ["cbop", "bc"]  # CBOP first
    assert rows[0]["seeds"] == "0 1"
    assert rows[0]["final_mean"] == pytest.approx(40.0)
    assert rows[0]["final_std"] == pytest.approx(10.0)  # population std over seeds
    assert rows[0]["best_mean"] == pytest.approx(41.0)
    assert "40.0 ± 10.0" in markdown_table(rows)


def test_score_rows_take_each_rows_protocol_final() -> None:
    """A 50,000-step row's final is its last 4 evaluations, an earlier row's its last 3,
    whatever final the summary stored."""
    curve = [[step, score] for step, score in enumerate((0.0, 8.0, 4.0, 4.0, 4.0), start=1)]
    long, earlier = _summary("cbop-50k", 0, 4.0), _summary("cbop", 0, 99.0)
    long["curve"] = earlier["curve"] = curve
    rows = {row["variant"]: row for row in score_rows([long, earlier])}
    assert rows["cbop-50k"]["final_mean"] == pytest.approx(5.0)  # (8 + 4 + 4 + 4) / 4
    assert rows["cbop"]["final_mean"] == pytest.approx(4.0)


def test_dataset_table_tells_a_copy_from_other_data() -> None:
    def run(sha256: str, data_key: str) -> dict:
        provenance = {"sha256": sha256, "data_key": data_key, "transitions": 10}
        return {"dataset": "hopper-medium-replay-gen", "dataset_provenance": provenance}

    same = dataset_markdown([run("aaaa" * 16, "k1"), run("aaaa" * 16, "k1")])
    assert "aaaaaaaaaaaa |" in same and "(" not in same.split("aaaaaaaaaaaa")[1]
    copy = dataset_markdown([run("aaaa" * 16, "k1"), run("bbbb" * 16, "k1")])
    assert "aaaaaaaaaaaa, bbbbbbbbbbbb (files of the same generator settings k1)" in copy
    other = dataset_markdown([run("aaaa" * 16, "k1"), run("bbbb" * 16, "k2")])
    assert "aaaaaaaaaaaa, bbbbbbbbbbbb (several versions!)" in other


def test_rliable_probability_of_improvement() -> None:
    summaries = [_summary("cbop", s, 80.0 + s) for s in range(3)]
    summaries += [_summary("bc", s, 20.0 + s) for s in range(3)]
    aggregates = rliable_aggregates(summaries, reps=50)
    if aggregates is None:  # rliable is optional (the "report" extra)
        return
    assert aggregates["probability_of_improvement"]["cbop,bc"][0] == pytest.approx(1.0)
    assert aggregates["cbop"]["iqm"][0] == pytest.approx(81.0)  # the 0-100 scale
    assert aggregates["bc"]["optimality_gap"][0] == pytest.approx(100 - 21.0)


def test_value_var_share_histograms_count_every_state() -> None:
    torch.manual_seed(0)
    returns = torch.randn(50, 3, 4, 5)  # [N, H+1, K, M]
    returns[:, 0] = returns[:, 0, :1]  # h = 0 is Q(s', a'): the same for every particle
    valid = torch.ones(50, 3, dtype=torch.bool)
    valid[:10, 2] = False
    counts = value_var_share_histograms(returns, valid, bins=10)
    assert [sum(row) for row in counts] == [50, 50, 40]
    assert counts[0][-1] == 50  # h = 0: no model variance, share 1


def test_variant_names() -> None:
    assert variant_name({"algo": "iql"}, {}) == "iql"
    assert variant_name({}, {"estimator": {"mode": "lcb"}}) == "cbop"
    assert variant_name({}, {"estimator": {"mode": "fixed", "fixed_weighting": "lambda"}}) == (
        "cbop-fixed-lambda"
    )
    assert variant_name({}, {"estimator": {"mode": "quantile"}}) == "cbop-quantile"


def test_load_summaries_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="does not exist"):
        load_summaries([tmp_path / "missing"])
    with pytest.raises(ReportError, match="no finished runs"):
        load_summaries([tmp_path])


def test_summaries_behind_a_link_are_read_once(tmp_path: Path) -> None:
    """A results folder gathered by symbolic links is read through them, and a summary
    reached both directly and through a link counts once."""
    kept = tmp_path / "kept" / "d" / "cbop"
    kept.mkdir(parents=True)
    (kept / "seed0.json").write_text(json.dumps(_summary("cbop", 0, 20.0)))
    (tmp_path / "view").mkdir()
    (tmp_path / "view" / "d").symlink_to(kept.parent, target_is_directory=True)
    (found,) = load_summaries([tmp_path / "view"])
    assert found["final_normalized_score"] == 20.0
    (tmp_path / "kept" / "again").symlink_to(kept, target_is_directory=True)
    assert len(load_summaries([tmp_path / "kept"])) == 1


def test_goal_check_is_the_bar_cbop_is_held_to() -> None:
    summaries = [_summary("cbop", 0, 50.0), _summary("bc", 0, 45.0), _summary("iql", 0, 44.0)]
    summaries[0]["analysis"] = {"conservatism": {"overestimation": -12.0}}
    line, over_sets = goal_check(score_rows(summaries), summaries)
    assert "best baseline bc 45.0 (+5.0; at least every baseline met; +5 met)" in line
    assert "keeps at least 0.98 of its best on every seed (met >= 0.8)" in line
    assert "Q - MC at the end at most -12.0 (met < 0 on every seed)" in line
    assert over_sets == "- over the sets: 1 of 1 at the best baseline + 5 (NOT met >= 2)"
    behind = [*summaries[1:], _summary("cbop", 0, 40.0)]
    line, _ = goal_check(score_rows(behind), behind)
    assert "(-5.0; at least every baseline NOT met; +5 not met)" in line
    assert "Q - MC" not in line  # no analysis in the summary: not claimed either way
    earlier = {**_summary("bc", 0, 99.0), "variant": "bc (file aaaaaaaaaaaa)"}
    line, _ = goal_check(score_rows([*summaries, earlier]), summaries)
    assert "best baseline bc 45.0" in line  # an earlier file's row is not a baseline here


def test_final_score_is_the_mean_of_the_last_evaluations() -> None:
    assert final_window_score([[3, 30.0], [1, 10.0], [4, 40.0], [2, 20.0]], 0.0) == 30.0
    assert final_window_score([], 7.0) == 7.0


def test_scalar_curves_of_a_copied_run_directory_are_merged(tmp_path: Path) -> None:
    """A run directory copied (or moved) and resumed logs under a second logger name."""

    def write_csv(name: str, rows: list[tuple[int, float]], mtime: float) -> None:
        path = tmp_path / "logs" / name / "scalars" / "eval" / "normalized_score.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{step},{value}\n" for step, value in rows))
        os.utime(path, (mtime, mtime))

    # The original run (newer name sorts first) to step 3; the copy resumed from its
    # step-2 checkpoint, so steps 3 and 4 come from the copy, written later.
    write_csv("seed1", [(1, 10.0), (2, 11.0), (3, 12.0)], mtime=1_000)
    write_csv("cbop-seed1", [(3, 20.0), (4, 21.0)], mtime=2_000)
    curve = read_scalar_curves(tmp_path, prefix="eval/")["normalized_score"]
    assert curve == [[1, 10.0], [2, 11.0], [3, 20.0], [4, 21.0]]


def test_rollout_from_observations_restarts_the_real_state() -> None:
    import gymnasium

    from cbop_torchrl.registry import get_family

    family = get_family("hopper")
    env = gymnasium.make(family.gym_id)
    obs, _ = env.reset(seed=3)
    action = [0.3, -0.2, 0.1]
    expected, discount = 0.0, 1.0
    for _ in range(20):
        obs_next, reward, terminated, truncated, _ = env.step(action)
        expected += discount * reward
        discount *= 0.9
        if terminated or truncated:
            break
    env.close()

    def constant_actor(td):
        return td.set("action", torch.tensor(action).expand(td.shape[0], 3))

    start = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
    returns, lengths = rollout_from_observations(constant_actor, family, start, 0.9, max_steps=20)
    assert returns[0].item() == pytest.approx(expected, rel=1e-4)


def test_conservatism_rows_show_the_paper_value_and_the_entropy_free_difference() -> None:
    from cbop_torchrl.evaluation.report import conservatism_markdown, paper_conservatism

    assert paper_conservatism("hopper-medium-replay-gen", "cbop") == -172.45
    assert paper_conservatism("walker2d-medium-replay-v2", "cql-60k") == -285.02
    assert paper_conservatism("halfcheetah-medium-gen", "cbop-avg999") == -106.24
    assert paper_conservatism("hopper-medium-replay-gen", "iql") is None
    assert paper_conservatism("swimmer-medium-gen", "cbop") is None
    numbers = {
        "predicted_q_mean": 150.0, "predicted_q_min": 149.0, "mc_return_mean": 170.0,
        "mc_return_std": 5.0, "overestimation": -20.0, "overestimation_max": 3.0, "states": 100,
    }  # fmt: skip
    summaries = [
        {"dataset": "hopper-medium-replay-gen", "variant": "cbop", "seed": 0,
         "analysis": {"conservatism": {**numbers, "overestimation_no_entropy": -31.5}}},
        {"dataset": "hopper-medium-replay-gen", "variant": "iql", "seed": 0,
         "analysis": {"conservatism": numbers}},
    ]  # fmt: skip
    table = conservatism_markdown(conservatism_rows(summaries)).splitlines()
    cbop = next(line for line in table if "| cbop |" in line)
    iql = next(line for line in table if "| iql |" in line)
    assert "| cbop | 0 | 100 | 150.0 |" in cbop and cbop.endswith("| -20.0, 3.0 | -31.5 | -172.4 |")
    assert iql.endswith("| -20.0, 3.0 | - | - |")  # an old summary: no entropy-free number


def test_headline_table_shows_current_variants_per_dataset_with_seeds_and_behaviour() -> None:
    summaries = [_summary("cbop", 0, 30.0, "a"), _summary("cbop", 1, 50.0, "a")]
    summaries += [_summary("bc", 0, 45.0, "a"), _summary("bc", 0, 5.0, "b")]
    summaries += [_summary("cbop-c2x256", 0, 99.0, "a")]  # an earlier configuration: not shown
    summaries[0]["dataset_provenance"] = {"policy_normalized_score": 34.71, "transitions": 1234}
    table = headline_markdown(summaries)
    lines = table.splitlines()
    assert lines[0] == "| algorithm | a | b |"
    assert lines[2] == "| CBOP (10 steps) | 40.0 (seeds 30.0 to 50.0; 2 seeds) | not run |"
    assert lines[3] == "| BC (10 steps) | **45.0** (1 seed) | **5.0** (1 seed) |"
    assert "99.0" not in table
    assert "| *behaviour policy (medium)* | 34.7 |  |" in table
    assert "1,234 transitions" in table
    assert headline_markdown(list(reversed(summaries))) == table  # one text for one set of runs


def test_the_headline_can_take_cbops_row_per_dataset_and_names_its_psi() -> None:
    summaries = [_summary("cbop", 0, 5.0, "a"), _summary("cbop-psi5", 0, 30.0, "a")]
    summaries += [_summary("cbop", 0, 12.0, "b"), _summary("bc", 0, 20.0, "a")]
    summaries += [_summary("bc", 0, 10.0, "b")]
    for summary, psi in zip(summaries[:3], (0.5, 5.0, 2.0), strict=True):
        summary["diagnostics"] = {"settings": {"psi": psi}}
    lines = headline_markdown(summaries, {"a": {"cbop": "cbop-psi5"}}).splitlines()
    assert lines[2] == "| CBOP (10 steps) | **30.0** (psi 5; 1 seed) | **12.0** (psi 2; 1 seed) |"
    assert lines[3] == "| BC (10 steps) | 20.0 (1 seed) | 10.0 (1 seed) |"
    assert headline_markdown(summaries).splitlines()[2].startswith("| CBOP (10 steps) | 5.0 (")


def test_runs_on_an_earlier_file_of_a_set_are_a_row_of_their_own(tmp_path: Path) -> None:
    def made_on(summary: dict, sha: str, finished: str, transitions: int) -> dict:
        provenance = {"sha256": sha * 64, "transitions": transitions, "episodes": 1}
        return summary | {"dataset_provenance": provenance, "finished_utc": finished}

    old = [made_on(_summary("cbop", s, 4.0, "w"), "a", "2026-11-26T10:00:00", 100) for s in (0, 1)]
    new = made_on(_summary("cbop", 0, 20.0, "w"), "b", "2026-11-27T10:00:00", 200)
    for index, summary in enumerate([*old, new]):
        (tmp_path / f"seed{index}.json").write_text(json.dumps(summary))
    found = load_summaries([tmp_path])
    assert current_files(found) == {"w": "b" * 12}
    assert sorted(s["variant"] for s in found) == ["cbop", *["cbop (file aaaaaaaaaaaa)"] * 2]
    table = headline_markdown(found)
    assert "| CBOP (10 steps) | **20.0** (1 seed) |" in table and "4.0" not in table
    assert "200 transitions" in table
    rows = {row["variant"]: row for row in score_rows(found)}
    assert rows["cbop (file aaaaaaaaaaaa)"]["seeds"] == "0 1"

    # A caller that knows the set's current file (the benchmark's rows.json) names it; the
    # file of the most recent run is then an earlier one, even before a run on it finished.
    named = load_summaries([tmp_path], current={"w": "a" * 64})
    assert sorted(s["variant"] for s in named) == ["cbop", "cbop", "cbop (file bbbbbbbbbbbb)"]


def test_every_series_gets_its_own_colour() -> None:
    variants = ["cbop", "bc", "td3bc", "iql", "cql"] + [f"cbop-x{i}" for i in range(25)]
    colours = variant_colours(variants)
    assert len({tuple(c) for c in colours.values()}) == len(variants)
    assert variant_colours(["cql", "cbop"])["cbop"] == colours["cbop"]  # current ones first


def test_the_report_readme_links_its_figures_where_it_sits(tmp_path: Path) -> None:
    summaries = [_summary("cbop", s, 30.0 + s) for s in range(2)]
    summaries += [_summary("bc", s, 20.0 + s) for s in range(2)]
    out = tmp_path / "report"
    write_report(summaries, out, figure_prefix=str(out) + "/", rliable_reps=100)
    readme = (out / "README_results.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert "curves_d.png" in images and "curves_all_d.png" in images
    assert all((out / image).is_file() for image in images)
    assert (out / "headline.md").read_text() in readme
