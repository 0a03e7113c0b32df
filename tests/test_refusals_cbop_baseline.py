"""What ``cbop-baseline`` (``scripts/baseline.py``) refuses: one paragraph, exit code 2,
before any work, nothing left behind.

Unknown algorithms, each algorithm's bad values, a bad dynamics choice and a cache it
cannot create. The cases run in this process, each from its own empty working folder
(tests/refusals.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from d4rl_files import write_d4rl_hdf5
from refusal_inputs import DEBUG, write_inputs
from refusals import OMEGACONF_FIELDS, Case, assert_refused, case_ids, run_cases, selected_cases

from cbop_torchrl.apps.api import compose_config, train_baseline
from cbop_torchrl.data import DatasetError


def cases(root: Path) -> dict[str, Case]:
    """Every refused command of this program's battery, its inputs written under ``root``."""
    i = write_inputs(root)

    def line(args: list[str], words: list[str], fields: bool = True, **kw) -> Case:  # noqa: ANN003
        """A one-line message; ``fields``: OmegaConf's error fields are not in it."""
        return Case("baseline.py", args, words, OMEGACONF_FIELDS if fields else [],
                    in_error_line=True, **kw)  # fmt: skip

    def case(args: list[str], words: list[str]) -> Case:
        return Case("baseline.py", args, words)

    return {
        "algo=sac": line(["algo=sac"], ["algo=sac", "td3bc", "iql", "cql"]),
        "dynamics.activation=bogus": line(
            ["preset=debug", "dynamics.activation=bogus"],
            ["dynamics.activation", "silu, relu, tanh, elu"],
        ),
        "an unwritable cache": line(
            ["preset=debug"],
            [
                f"the cache directory '{i.unwritable}'",
                str(i.unwritable_part),
                "CBOP_TORCHRL_CACHE=",
            ],
            env={"CBOP_TORCHRL_CACHE": str(i.unwritable)},
        ),  # fmt: skip
        "td3bc policy_delay=0": case(
            ["algo=td3bc", *DEBUG, "algo.policy_delay=0"],
            ["algo.policy_delay=0 must be an integer >= 1"],
        ),
        "td3bc alpha=inf": case(["algo=td3bc", *DEBUG, "algo.alpha=inf"], ["algo.alpha=inf"]),
        "iql temperature=-3": case(
            ["algo=iql", *DEBUG, "algo.temperature=-3"],
            ["algo.temperature=-3", "must be a number >= 0"],
        ),
        "cql num_random=0": case(
            ["algo=cql", *DEBUG, "algo.num_random=0"], ["algo.num_random=0 must be an integer >= 1"]
        ),
        "cql cql_temperature=0": case(
            ["algo=cql", *DEBUG, "algo.cql_temperature=0"], ["algo.cql_temperature=0"]
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


def test_baselines_refuse_a_dataset_smaller_than_a_batch(tmp_path: Path) -> None:
    """On main a baseline trained on a 1-row file and reported a score."""
    one_row = tmp_path / "hopper-one.hdf5"
    write_d4rl_hdf5(one_row, episode_lengths=(1,), terminal_episodes=(), timeout_episodes=())
    cfg = compose_config(["preset=debug", f"env={one_row}", "algo=bc"], command="baseline")
    with pytest.raises(DatasetError, match=r"1 transition, fewer than one batch \(train.batch_si"):
        train_baseline(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
