"""What ``cbop-evaluate`` (``scripts/evaluate.py``) refuses: one paragraph, exit code 2,
before any work, nothing left behind.

A missing checkpoint, bad values, an output it cannot write, and files that are no
checkpoint (JSON, CSV, text, HDF5, a folder, a FIFO), never unpickled. The cases run in
this process, each from its own empty working folder (tests/refusals.py); one runs as a
process of its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from refusal_inputs import write_inputs
from refusals import (
    OMEGACONF_FIELDS,
    Case,
    assert_refused,
    case_env,
    case_ids,
    run_cases,
    selected_cases,
)

ROOT = Path(__file__).resolve().parents[1]


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)
    not_checkpoints = {**i.not_checkpoints, "hdf5": (i.plain, None, "an HDF5 file")}

    def line(args: list[str], words: list[str], fields: bool = True, **kw) -> Case:  # noqa: ANN003
        """A one-line message; ``fields``: OmegaConf's error fields are not in it."""
        return Case("evaluate.py", args, words, OMEGACONF_FIELDS if fields else [],
                    in_error_line=True, **kw)  # fmt: skip

    def case(args: list[str], words: list[str], not_words=()) -> Case:  # noqa: ANN001
        return Case("evaluate.py", args, words, list(not_words))

    return {
        "no checkpoint": line([], ["checkpoint"]),
        "an unwritable output": line(
            ["checkpoint=policy.pt", f"output={i.unwritable}/scores.json"],
            [f"output={i.unwritable}/scores.json cannot be written", str(i.unwritable_part)],
        ),
        "seed=${seed}": line(
            ["checkpoint=x.pt", "seed=${seed}"],
            ["seed=${seed}", "never the key's own"],
            fields=False,
        ),
        "seed=-5": case(["checkpoint=x.pt", "seed=-5"], ["seed=-5"]),
        "max_steps=0": case(["checkpoint=x.pt", "max_steps=0"], ["max_steps=0"]),
        **{
            f"checkpoint= {kind}": case([f"checkpoint={path}"], [what], ["pickle", "unpickle"])
            for kind, (path, _, what) in not_checkpoints.items()
        },
        "checkpoint= a folder": case([f"checkpoint={i.folder}"], ["is a folder"]),
        "checkpoint= a FIFO": case([f"checkpoint={i.fifo}"], ["is a FIFO"]),
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


def test_the_script_exits_2_without_a_checkpoint(tmp_path: Path) -> None:
    """The one refusal of this program run as a process of its own (the interpreter's exit
    code of ``scripts/evaluate.py``)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py")],
        cwd=tmp_path, env=case_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert_refused(done, tmp_path, Case("evaluate.py", [], ["checkpoint"], OMEGACONF_FIELDS))
