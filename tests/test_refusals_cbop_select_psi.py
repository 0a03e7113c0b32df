"""What ``cbop-select-psi`` (``scripts/select_psi.py``) refuses: one paragraph, exit code 2,
before any work, nothing left behind.

Bad values, sweep folders it must not walk (``/``, ``/proc/self``), a FIFO named like a
run's config (skipped, never opened), and a ``json=`` output it did not write or that is a
link. The cases run in this process, each from its own empty working folder
(tests/refusals.py); one runs as a process of its own, so the interpreter's exit code of
``scripts/select_psi.py`` is checked too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from refusal_inputs import UNSET, kept, unwritable_dir, write_inputs
from refusals import Case, assert_refused, case_env, case_ids, run_cases, selected_cases

from cbop_torchrl.apps import select_psi

ROOT = Path(__file__).resolve().parents[1]


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)

    def case(args: list[str], words: list[str], not_words=(), **kw) -> Case:  # noqa: ANN001, ANN003
        return Case("select_psi.py", args, words, list(not_words), **kw)

    return {
        "qvalue_nets=1": case(
            [f"sweep_dir={i.empty_sweep}", "qvalue_nets=1"],
            ["qvalue_nets=1", "at least 2"],
            ["parameter list"],
        ),  # fmt: skip
        "batch_size=0": case([f"sweep_dir={i.empty_sweep}", "batch_size=0"], ["batch_size=0"]),
        # would block forever on the FIFO it opened (the alarm fails it)
        "a FIFO config.json": case([f"sweep_dir={i.fifo_sweep}"], ["no trained runs"]),
        # sweep_dir=/ would walk every folder of the machine (and /proc/<pid>/cwd links)
        "sweep_dir=/": case(["sweep_dir=/"], ["sweep_dir=/", "the whole file system"]),
        "sweep_dir=/proc/self": case(["sweep_dir=/proc/self"], ["sweep_dir=/proc/self", "/proc"]),
        "json onto a run's policy.pt": case(
            [f"sweep_dir={i.sweep}", "steps=20", f"json={i.sweep}/run/policy.pt"],
            ["policy.pt", "was not written by cbop-torchrl"],
            kept=kept(i.sweep / "run" / "policy.pt"),
        ),
        "json onto a user's json": case(
            [f"sweep_dir={i.sweep}", f"json={i.own_json}"],
            ["notes.json", "was not written by cbop-torchrl"],
            kept=kept(i.own_json),
        ),  # fmt: skip
        "json through a link": case(
            [f"sweep_dir={i.sweep}", f"json={i.linked_json}"],
            ["link.json", "is a link"],
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


def test_the_script_exits_2_on_an_interpolation_of_the_key_itself(tmp_path: Path) -> None:
    """The one refusal of this program run as a process of its own."""
    env = {k: v for k, v in case_env(tmp_path).items() if k != UNSET}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "select_psi.py"), "sweep_dir=.",
         "qvalue_nets=${qvalue_nets}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    case = Case("select_psi.py", [], ["qvalue_nets=${"], in_error_line=True)
    assert_refused(done, tmp_path, case)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["task.ref_min_score=abc", "task.ref_max_score=1"], ["task.ref_min_score must be"]),
        (["task.gym_kwargs=3"], ["task.gym_kwargs must be a mapping"]),
        (["task.ref_min_score=3"], ["task.ref_min_score=3.0 and task.ref_max_score=null"]),
        (["device=gpu"], ["device=gpu: device='gpu' is not a device"]),
        (["steps=0"], ["steps=0 must be an integer >= 1"]),
        (["qvalue_nets=abc"], ["qvalue_nets must be an integer, e.g. qvalue_nets=2"]),
        (["json={unwritable}/x.json"], ["cannot be written", "{unwritable_part}", "set json="]),
        (["json="], ["json is an empty string"]),
    ],
)
def test_select_psi_checks_every_argument_before_reading_runs(
    argv: list[str], words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The sweep directory does not even exist: each refusal comes before it is looked at."""
    unwritable, blocking = unwritable_dir(tmp_path)
    values = {"unwritable": unwritable, "unwritable_part": blocking}
    argv = [f"sweep_dir={tmp_path / 'no_sweep'}", *(a.format(**values) for a in argv)]
    assert select_psi.main(argv) == 2
    error = capsys.readouterr().err
    assert "no_sweep" not in error
    for word in words:
        assert word.format(**values) in error, error
