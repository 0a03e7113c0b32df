"""Checks shared by the tests that compare two runs' checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch


def assert_same_training_state(run_dir: Path, reference_dir: Path) -> None:
    expected = torch.load(reference_dir / "checkpoint.pt", weights_only=True)
    actual = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert actual["step"] == expected["step"] == actual["total_steps"]
    assert expected["loss_module"].keys() == actual["loss_module"].keys()
    for key, value in expected["loss_module"].items():
        assert torch.equal(value, actual["loss_module"][key]), key
    for index, state in expected["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[name], actual["optimizer"]["state"][index][name]), name
    assert expected["trainer_loop"]["optim_steps"] == actual["trainer_loop"]["optim_steps"]
