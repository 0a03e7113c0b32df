"""What ``cbop-train-dynamics`` (``scripts/train_dynamics.py``) refuses: one paragraph,
exit code 2, before any work, nothing left behind.

Bad dynamics values, data files it cannot read (missing, a FIFO, an array stored as a
group) and an output file it did not write. The cases run in this process, each from its
own empty working folder (tests/refusals.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from refusal_inputs import kept, write_inputs
from refusals import OMEGACONF_FIELDS, Case, assert_refused, case_ids, run_cases, selected_cases


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)
    out = f"output_dir={i.dyn_out}"

    def line(args: list[str], words: list[str], fields: bool = True, **kw) -> Case:  # noqa: ANN003
        """A one-line message; ``fields``: OmegaConf's error fields are not in it."""
        return Case("train_dynamics.py", args, words, OMEGACONF_FIELDS if fields else [],
                    in_error_line=True, **kw)  # fmt: skip

    def case(args: list[str], words: list[str], **kw) -> Case:  # noqa: ANN003
        return Case("train_dynamics.py", args, words, **kw)

    return {
        "dynamics.num_members=abc": line(
            ["dynamics.num_members=abc"], ["dynamics.num_members", "an integer"]
        ),
        "dynamics.activation=bogus": line(
            ["output_dir=out", "dynamics.activation=bogus"],
            ["dynamics.activation", "silu, relu, tanh, elu"],
        ),
        "env= a missing file": line([f"env={i.missing}"], ["no file at", "missing.hdf5"]),
        "env= a FIFO": case([f"env={i.fifo}", out], ["is a FIFO"]),
        "dynamics.lr=0": case([out, "dynamics.lr=0"], ["dynamics.lr=0"]),
        "weight_decay<0": case(
            [out, "dynamics.weight_decay=[0,0,0,0,-1e-4]"], ["dynamics.weight_decay"]
        ),
        "rewards is a group": case(
            [f"env={i.rewards_group}", f"output_dir={root / 'dyn_new'}"], ["rewards is a group"]
        ),
        "onto a user's metrics": case(
            [f"env={i.base}", f"output_dir={i.dynamics_out}"],
            ["dynamics_metrics.json", "was not written by cbop-torchrl"],
            kept=kept(i.dynamics_out / "dynamics_metrics.json"),
        ),
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
