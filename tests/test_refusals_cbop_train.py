"""What ``cbop-train`` (``scripts/cbop.py``) refuses: one paragraph, exit code 2, before any
work, nothing left behind.

Bad values of every section (ranges, types, interpolations, devices, multirun values),
hostile or broken config files, run folders it cannot make or did not make, and data files
it cannot train on (too small, stored in ways that change the values, links that lead
nowhere, values too large, folders and FIFOs). The cases run in this process, each from
its own empty working folder (tests/refusals.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from refusal_inputs import DEBUG, ON_DATA, UNCHAINED, user_run_like_folder, write_inputs
from refusals import OMEGACONF_FIELDS, Case, assert_refused, case_ids, run_cases, selected_cases

from cbop_torchrl.trainers.rundir import MARKER_NAME


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)

    def line(args: list[str], words: list[str], fields: bool = True, **kw) -> Case:  # noqa: ANN003
        """A one-line message; ``fields``: OmegaConf's error fields are not in it."""
        return Case("cbop.py", args, words, OMEGACONF_FIELDS if fields else [],
                    in_error_line=True, **kw)  # fmt: skip

    def case(args: list[str], words: list[str], not_words=(), **kw) -> Case:  # noqa: ANN001, ANN003
        return Case("cbop.py", args, words, list(not_words), **kw)

    return {
        # one-line messages naming the value and the rule
        "estimator.horizon=2.5": line(
            ["estimator.horizon=2.5"],
            ["estimator.horizon=2.5", "must be null or an integer", "configs/config.yaml"],
        ),
        "train.batch_size=-3": line(
            ["train.batch_size=-3"], ["train.batch_size=-3", "an integer >= 1"]
        ),
        # refused before a multirun/ folder is made
        "-m seed=abc,1": line(["-m", "seed=abc,1"], ["seed=abc: seed must be an integer"]),
        # refused by the job
        "-m train.batch_size=-3,1": line(
            ["-m", "train.batch_size=-3,1"], ["train.batch_size=-3", "an integer >= 1"]
        ),
        "device=cuda": line(["device=cuda"], ["device=cuda", "device=auto", "device=cpu"]),
        "a dataset of one row": line(
            ["preset=debug", f"env={i.one_row}", "estimator.psi=1"],
            ["too small to train on", "1 transition", "train.batch_size=32", "needs at least 5"],
        ),
        "an unwritable run directory": line(
            ["preset=debug", f"hydra.run.dir={i.unwritable}"],
            ["cannot create the run directory", str(i.unwritable_part), "hydra.run.dir="],
        ),
        "hydra.run.dir=/proc": line(
            ["preset=debug", "hydra.run.dir=/proc"], ["'/proc'", "hydra.run.dir="]
        ),
        "agent.eta=-5": line(["preset=debug", "agent.eta=-5"], ["agent.eta=-5", ">= 0"]),
        "seed=${seed}": line(
            ["preset=debug", "seed=${seed}"], ["seed=${seed}", "e.g. seed=0"], fields=False
        ),
        # tracebacks where one paragraph belongs
        "hidden_sizes=[]": case(
            [*DEBUG, "agent.hidden_sizes=[]"],
            ["agent.hidden_sizes=[]", "at least 1 item"],
            ["max()"],
        ),  # fmt: skip
        "critic_hidden_sizes=[]": case(
            [*DEBUG, "agent.critic_hidden_sizes=[]"], ["agent.critic_hidden_sizes=[]"]
        ),
        "fqe.target_tau=5": case(
            [*DEBUG, "fqe.target_tau=5"], ["fqe.target_tau=5", "(0, 1]"], ["eps"]
        ),
        "agent.tau=2": case([*DEBUG, "agent.tau=2"], ["agent.tau=2", "(0, 1]"]),
        "seed=-1": case([*DEBUG, "seed=-1"], ["seed=-1 must be an integer from 0"]),
        "seed=2**70": case(
            [*DEBUG, "seed=1180591620717411303424"],
            ["seed=1180591620717411303424 must be an integer from 0 to 2**32 - 1"],
        ),
        "num_qvalue_nets=1": case(
            [*DEBUG, "agent.num_qvalue_nets=1"],
            ["agent.num_qvalue_nets=1", "at least 2"],
            ["parameter list"],
        ),  # fmt: skip
        # nonsense accepted, or refused late
        "psi=inf": case([*DEBUG, "estimator.psi=inf"], ["estimator.psi=inf"], ["learning rate"]),
        "dynamics.lr=0": case([*DEBUG, "dynamics.lr=0"], ["dynamics.lr=0"]),
        "dynamics.lr=inf": case([*DEBUG, "dynamics.lr=inf"], ["dynamics.lr=inf"]),
        "dynamics.weight_decay=[-1,0,0]": case(
            [*DEBUG, "dynamics.weight_decay=[-1,0,0]"],
            ["dynamics.weight_decay=[-1.0,0.0,0.0]", "each a number >= 0"],
        ),
        "dynamics.logvar_bound_coef=-1": case(
            [*DEBUG, "dynamics.logvar_bound_coef=-1"], ["dynamics.logvar_bound_coef"]
        ),
        "dynamics.improvement_threshold=2": case(
            [*DEBUG, "dynamics.improvement_threshold=2"], ["dynamics.improvement_threshold=2"]
        ),
        # config files
        "yaml tag": case(
            ["--config-dir", str(i.evil_config), "preset=evil"],
            ["YAML tag", "python/object/apply:os.system", "evil.yaml", "line 1"],
            ["ConstructorError"],
            absent=[i.sentinel],
        ),  # fmt: skip
        "invalid YAML in a preset": case(
            ["--config-dir", str(i.evil_config), "preset=broken"],
            ["broken.yaml", "is not valid YAML"],
        ),
        # a folder no cbop-torchrl run wrote
        **{
            f"a folder with a stray lock, resume={resume}": case(
                [*DEBUG, f"hydra.run.dir={folder}", f"resume={resume}"],
                ["no cbop-torchrl run wrote there", "config.json"],
                kept=user_run_like_folder(folder),
                absent=[folder / MARKER_NAME, folder / ".hydra"],
            )
            for resume, folder in i.run_like.items()
        },
        # data stored in ways that change the values, or that lead nowhere
        "float16 observations": case(
            [*ON_DATA, f"env={i.float16}"], [UNCHAINED, "float16"], ["too small"]
        ),
        "scaleoffset observations": case(
            [*ON_DATA, f"env={i.scaleoffset}"], [UNCHAINED, "scaleoffset"], ["too small"]
        ),
        "float16 next_observations": case(
            [*ON_DATA, f"env={i.next_f16}"], [UNCHAINED], ["too small"]
        ),
        "a soft-link loop": case(
            [*ON_DATA, f"env={i.loop}"], ["observations is a soft link", "loop"]
        ),
        "a dangling soft link": case([*ON_DATA, f"env={i.dangling}"], ["rewards is a soft link"]),
        "rewards is a group": case(
            [*ON_DATA, f"env={i.rewards_group}"], ["rewards is a group"], ["attribute"]
        ),
        "observations link to a missing file": case(
            [*ON_DATA, f"env={i.linked_missing}"], ["observations", "'gone.h5'", "does not exist"]
        ),
        "virtual dataset from a missing file": case(
            [*ON_DATA, f"env={i.virtual_missing}"], ["observations", "'vgone.h5'"]
        ),
        "rewards x 1e30": case(
            [*ON_DATA, f"env={i.big_rewards}"],
            ["rewards has values up to 1", "Rescale rewards"],
            ["dynamics.lr="],
        ),  # fmt: skip
        "observations x 1e30": case(
            [*ON_DATA, f"env={i.big_observations}"],
            ["observations has values up to", "Rescale observations"],
            ["dynamics.lr="],
        ),  # fmt: skip
        "actions x 1e30": case([*ON_DATA, f"env={i.big_actions}"], ["actions has values up to"]),
        "env= a folder": case([*ON_DATA, f"env={i.folder}"], ["is a folder"], ["no file at"]),
        "env= a FIFO": case([*ON_DATA, f"env={i.fifo}"], ["is a FIFO"], ["no file at"]),
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
