"""What ``cbop-evaluate`` (``scripts/evaluate.py``) refuses: one paragraph, exit code 2,
before any work, nothing left behind.

A missing checkpoint, bad values, an output it cannot write, and files that are no
checkpoint (JSON, CSV, text, HDF5, a folder, a FIFO), never unpickled. The cases run in
this process, each from its own empty working folder (tests/refusals.py); one runs as a
process of its own. On a finished run (conftest's ``finished_run``): an ``output=`` it did not
write, more episodes than fit, an out-of-memory error, and edited policies (NaN weights,
equal reference scores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from refusal_inputs import edited_policy, write_inputs
from refusals import (
    OMEGACONF_FIELDS,
    Case,
    assert_refused,
    case_env,
    case_ids,
    evaluate_in,
    run_cases,
    selected_cases,
)

from cbop_torchrl.envs import EVALUATION_FORMAT

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


# ------------------------------------------------------------ a finished run's evaluation


def test_evaluate_never_replaces_a_file_it_did_not_write(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    checkpoint = finished_run["run"] / "checkpoint.pt"
    before = checkpoint.read_bytes()
    user_file = tmp_path / "notes.txt"
    user_file.write_text("mine\n")
    results = finished_run["run"] / "results.json"
    results_before = results.read_text()
    cases = [
        (checkpoint, "is the checkpoint being evaluated"),
        (user_file, "is not an evaluation output of cbop-evaluate"),
        (results, "is not an evaluation output of cbop-evaluate"),
        (tmp_path, "is a directory; output= takes the path of a JSON file"),
    ]
    for output, words in cases:
        code = evaluate_in(tmp_path, monkeypatch, f"checkpoint={checkpoint}", f"output={output}")
        err = capsys.readouterr().err
        assert code == 2, err
        assert words in err and "Traceback" not in err, err
    assert checkpoint.read_bytes() == before
    assert user_file.read_text() == "mine\n" and results.read_text() == results_before

    # a previous output of this program is replaced
    output = tmp_path / "eval.json"
    argv = [f"checkpoint={checkpoint}", f"output={output}", "episodes=1", "max_steps=5"]
    assert evaluate_in(tmp_path, monkeypatch, *argv) == 0, capsys.readouterr().err
    assert json.loads(output.read_text())["format"] == EVALUATION_FORMAT
    assert evaluate_in(tmp_path, monkeypatch, *argv, "seed=1") == 0, capsys.readouterr().err
    assert json.loads(output.read_text())["episodes"] == 1


def test_evaluate_refuses_more_episodes_than_fit_before_making_any_environment(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import cbop_torchrl.envs.gym as gym_module

    def no_env(*args, **kwargs):
        raise AssertionError("an environment was made before the size check")

    monkeypatch.setattr(gym_module, "SerialEnv", no_env)
    checkpoint = finished_run["run"] / "policy.pt"
    assert evaluate_in(tmp_path, monkeypatch, f"checkpoint={checkpoint}", "episodes=100000") == 2
    err = capsys.readouterr().err
    assert "episodes=100000 (at most about" in err and "available memory" in err, err
    assert "closed environment" not in err


def test_an_out_of_memory_error_while_evaluating_is_reported_not_a_closed_environment(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import cbop_torchrl.envs as envs

    def out_of_memory(*args, **kwargs):
        raise MemoryError("mj_makeData: could not allocate memory")  # before any env started

    monkeypatch.setattr(envs, "evaluate_policy", out_of_memory)
    checkpoint = finished_run["run"] / "policy.pt"
    assert evaluate_in(tmp_path, monkeypatch, f"checkpoint={checkpoint}", "episodes=2") == 2
    err = capsys.readouterr().err
    assert "ran out of memory with episodes=2" in err and "could not allocate" in err, err
    assert "closed environment" not in err and "Traceback" not in err


def test_an_edited_policy_with_nan_weights_or_equal_reference_scores_is_refused(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def nan_weights(state: dict) -> None:
        name = next(iter(state["actor"]))
        state["actor"][name] = torch.full_like(state["actor"][name], float("nan"))

    policy = edited_policy(finished_run, tmp_path, nan_weights)
    assert evaluate_in(tmp_path, monkeypatch, f"checkpoint={policy}") == 2
    err = capsys.readouterr().err
    assert "non-finite weights" in err and "Traceback" not in err, err

    def equal_scores(state: dict) -> None:
        state["policy"]["task"]["ref_min_score"] = 100.0
        state["policy"]["task"]["ref_max_score"] = 100.0

    policy = edited_policy(finished_run, tmp_path, equal_scores)
    assert evaluate_in(tmp_path, monkeypatch, f"checkpoint={policy}") == 2
    err = capsys.readouterr().err
    assert "must be finite and differ" in err and "Traceback" not in err, err
