"""What ``cbop-report`` (``scripts/report.py``) refuses: one paragraph, exit code 2, before
any work, nothing left behind.

Unset interpolations, folders it must not walk (``/``, ``/dev``), FIFOs named like the
files it reads (skipped, never opened), and output files it did not write or that are
links. The cases run in this process, each from its own empty working folder
(tests/refusals.py). A finished run (conftest's ``finished_run``) is reported with the cache
cleared, with a truncated or incomplete summary or results.json, and without matplotlib.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from refusal_inputs import UNSET, kept, unwritable_dir, write_inputs
from refusals import Case, assert_refused, case_ids, run_cases, selected_cases

from cbop_torchrl.apps import report
from cbop_torchrl.evaluation.summaries import ReportError, load_summaries, summarize_run
from cbop_torchrl.io import OUTPUTS_MANIFEST


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)
    return {
        "out= an unset variable": Case(
            "report.py",
            ["paths=runs", f"out=${{oc.env:{UNSET}}}"],
            [UNSET, "must be set"],
            in_error_line=True,
        ),  # fmt: skip
        # each would block forever on a FIFO it opened (the alarm fails it)
        "FIFOs named *.json": Case(
            "report.py",
            [f"paths={i.fifo_report}", f"out={root / 'report_fifo_out'}"],
            ["no finished runs"],
        ),  # fmt: skip
        "paths=/": Case("report.py", ["paths=/", f"out={root / 'report_root'}"], ["paths=/"]),
        "rliable_reps=0": Case(
            "report.py",
            [f"paths={i.sweep}", f"out={root / 'report_reps'}", "rliable_reps=0"],
            ["rliable_reps=0", "at least 1", "rliable_reps=2000"],
            absent=[root / "report_reps"],
        ),  # fmt: skip
        "rliable_reps=abc": Case(
            "report.py",
            [f"paths={i.sweep}", f"out={root / 'report_reps_abc'}", "rliable_reps=abc"],
            ["rliable_reps", "abc"],
        ),  # fmt: skip
        "paths=/dev": Case(
            "report.py", ["paths=/dev", f"out={root / 'report_dev'}"], ["paths=/dev"]
        ),
        "onto a user's results.md": Case(
            "report.py",
            [f"paths={i.sweep}", f"out={i.report_out}"],
            ["results.md", "was not written by cbop-torchrl"],
            kept=i.report_files,
        ),  # fmt: skip
        "into a folder with a planted manifest": Case(
            "report.py",
            [f"paths={i.sweep}", f"out={i.planted}"],
            [OUTPUTS_MANIFEST, "is a link"],
            kept=kept(i.own_json),
        ),  # fmt: skip
    }


CASE_IDS = case_ids(cases)
TEST = "test_a_bad_input_is_one_paragraph_before_any_work"


@pytest.fixture(scope="module")
def refused(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The selected cases, run in this process one after another (tests/refusals.py)."""
    root = tmp_path_factory.mktemp("refusals")
    return run_cases(selected_cases(request, TEST, cases(root)), root)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_a_bad_input_is_one_paragraph_before_any_work(case_id: str, refused: dict) -> None:
    assert_refused(*refused[case_id])


def test_report_names_an_unwritable_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    unwritable, blocking = unwritable_dir(tmp_path)
    assert report.main([f"paths={tmp_path}", f"out={unwritable}"]) == 2
    error = capsys.readouterr().err
    assert f"out={unwritable} cannot be written" in error and str(blocking) in error


# ------------------------------------------------------------------- a finished run's report


def test_report_on_a_finished_run_needs_nothing_from_a_cleared_cache(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    cache = Path(finished_run["env"]["CBOP_TORCHRL_CACHE"])
    assert any(cache.iterdir())  # the run cached its dataset and dynamics model
    empty_cache = tmp_path / "cleared_cache"  # as after `rm -rf` of the cache (README: safe)
    empty_cache.mkdir()
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(empty_cache))
    monkeypatch.chdir(tmp_path)
    code = report.main([f"paths={finished_run['run']}", "out=report"])
    assert code == 0, capsys.readouterr().err
    out = tmp_path / "report"
    assert "| hopper-medium-replay-tiny | cbop | 1 (0) | 40 |" in (out / "results.md").read_text()
    # the checkpoint-based analysis ran (it rebuilt what it needed from the data file)
    assert (out / "rh_hopper-medium-replay-tiny_cbop.png").read_bytes()[:4] == b"\x89PNG"
    assert "| hopper-medium-replay-tiny | cbop |" in (out / "conservatism.md").read_text()


def _summary_folder(finished_run: dict, root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two seeds' summaries of the finished run in ``root/results``."""
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", finished_run["env"]["CBOP_TORCHRL_CACHE"])
    summary = summarize_run(finished_run["run"], analysis=False)
    folder = root / "results" / "tiny" / "cbop"
    folder.mkdir(parents=True)
    for seed in (0, 1):
        (folder / f"seed{seed}.json").write_text(json.dumps({**summary, "seed": seed}))
    return root / "results"


def test_a_truncated_summary_is_an_error_naming_the_file_not_a_missing_seed(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    folder = _summary_folder(finished_run, tmp_path, monkeypatch)
    assert len(load_summaries([folder])) == 2
    seed1 = folder / "tiny" / "cbop" / "seed1.json"
    text = seed1.read_text()
    seed1.write_text(text[: len(text) // 2])  # a copy cut short
    with pytest.raises(ReportError, match="seed1.json"):
        load_summaries([folder])

    monkeypatch.chdir(tmp_path)
    assert report.main([f"paths={folder}", "out=report"]) == 2
    err = capsys.readouterr().err
    assert "seed1.json" in err and "truncated or damaged" in err
    assert not (tmp_path / "report").exists()

    run = tmp_path / "run"
    shutil.copytree(finished_run["run"], run)
    results = json.loads((run / "results.json").read_text())
    del results["seed"]
    (run / "results.json").write_text(json.dumps(results))
    with pytest.raises(ReportError, match=r"results\.json.*lacks seed"):
        load_summaries([run], analysis=False)
    (run / "results.json").write_text(json.dumps(results)[:50])
    with pytest.raises(ReportError, match=r"cannot read .*results\.json"):
        load_summaries([run], analysis=False)

    summary = json.loads(text)
    del summary["final_normalized_score"]  # parses, but is no longer a whole summary
    seed1.write_text(json.dumps(summary))
    with pytest.raises(ReportError, match=r"seed1\.json.*final_normalized_score"):
        load_summaries([folder])


def test_report_without_matplotlib_names_the_extra_and_writes_nothing(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    monkeypatch.chdir(tmp_path)
    assert report.main([f"paths={finished_run['run']}", "out=report"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "cbop-torchrl[report]"' in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no results.csv/md, no runs.csv
