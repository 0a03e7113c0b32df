"""What ``cbop-collect`` (``scripts/collect.py``) refuses: one paragraph, exit code 2,
before any work, nothing left behind.

Bad values of the collection and of its SAC agent, names that would leave the output
folder, an output folder it cannot make, and output files it did not write. The cases run
in this process, each from its own empty working folder (tests/refusals.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from refusal_inputs import COLLECT, UNSET, kept, write_inputs
from refusals import OMEGACONF_FIELDS, Case, assert_refused, case_ids, run_cases, selected_cases


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)
    dirs = i.collect_dirs

    def line(args: list[str], words: list[str], fields: bool = True, **kw) -> Case:  # noqa: ANN003
        """A one-line message; ``fields``: OmegaConf's error fields are not in it."""
        return Case("collect.py", args, words, OMEGACONF_FIELDS if fields else [],
                    in_error_line=True, **kw)  # fmt: skip

    def case(args: list[str], words: list[str], not_words=(), **kw) -> Case:  # noqa: ANN001, ANN003
        return Case("collect.py", args, words, list(not_words), **kw)

    return {
        "an unwritable out_dir": line(
            [f"out_dir={i.unwritable}"],
            [f"out_dir={i.unwritable} cannot be", str(i.unwritable_part)],
        ),
        "medium_reference=x": line(["medium_reference=x"], ["medium_reference", "best, d4rl"]),
        "tag= sac.lr=nan": line(
            ["tag=", "sac.lr=nan"], ["tag is an empty string", "sac.lr=nan is not a"]
        ),
        "tag=x/../../escaped": line(
            ["tag=x/../../escaped", "out_dir=out"],
            ["tag='x/../../escaped' must be a plain name part", "tag=demo"],
        ),
        "seed= an unset variable": line([f"seed=${{oc.env:{UNSET}}}"], [UNSET, "must be set"]),
        "seed=2**32": case(["seed=4294967296"], ["seed=4294967296"]),
        "sac.gamma=2": case([*COLLECT, "sac.gamma=2"], ["sac.gamma=2"]),
        "sac.hidden_sizes=[]": case([*COLLECT, "sac.hidden_sizes=[]"], ["sac.hidden_sizes=[]"]),
        "compression_level=99": case(
            [*COLLECT, "compression_level=99"], ["compression_level=99", "[0, 9]"], ["GZIP setting"]
        ),
        "compression_level=-1": case([*COLLECT, "compression_level=-1"], ["compression_level=-1"]),
        "onto a non-HDF5 file": case(
            [*COLLECT, f"out_dir={dirs['text']}"],
            ["hopper-random-gen.hdf5", "was not written by cbop-torchrl"],
            ["signature"],
            kept=kept(dirs["text"] / "hopper-random-gen.hdf5"),
        ),  # fmt: skip
        "onto a user's HDF5 file": case(
            [*COLLECT, f"out_dir={dirs['h5']}"],
            ["hopper-random-gen.hdf5", "was not written by cbop-torchrl"],
            kept=kept(dirs["h5"] / "hopper-random-gen.hdf5"),
        ),
        "onto a user's provenance file": case(
            [*COLLECT, f"out_dir={dirs['provenance']}"],
            ["hopper-random-gen.provenance.json", "was not written by cbop-torchrl"],
            kept=kept(dirs["provenance"] / "hopper-random-gen.provenance.json"),
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
