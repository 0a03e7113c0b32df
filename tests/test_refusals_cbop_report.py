"""What ``cbop-report`` (``scripts/report.py``) refuses: one paragraph, exit code 2, before
any work, nothing left behind.

Unset interpolations, folders it must not walk (``/``, ``/dev``), FIFOs named like the
files it reads (skipped, never opened), and output files it did not write or that are
links. The cases run in this process, each from its own empty working folder
(tests/refusals.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from refusal_inputs import UNSET, kept, unwritable_dir, write_inputs
from refusals import Case, assert_refused, case_ids, run_cases, selected_cases

from cbop_torchrl.apps import report
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
