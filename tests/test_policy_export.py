"""The policy export (``policy.pt2``) runs with plain PyTorch and acts like the actor.

The exported program is loaded and run in a subprocess that imports torch
only (no cbop_torchrl, TorchRL or TensorDict), on observations saved by this
process; its actions must equal the actor's deterministic (evaluation) actions.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.modules.actor_critic import make_actor, make_deterministic_actor
from cbop_torchrl.registry import get_family
from cbop_torchrl.trainers.checkpoint import load_policy, policy_metadata, save_policy

PLAIN_TORCH = """
import sys
import torch
policy = torch.export.load(sys.argv[1]).module()
observations = torch.load(sys.argv[2], weights_only=True)
torch.save([policy(obs) for obs in observations], sys.argv[3])
packages = {"cbop_torchrl", "torchrl", "tensordict"}
imported = sorted({name.split(".")[0] for name in sys.modules} & packages)
assert not imported, imported
"""


def run_plain_torch(program: Path, observations: list[torch.Tensor], tmp_path: Path) -> list:
    inputs, outputs = tmp_path / "observations.pt", tmp_path / "actions.pt"
    torch.save(observations, inputs)
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_TORCH, str(program), str(inputs), str(outputs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(outputs, weights_only=True)


@pytest.mark.parametrize("build", [make_actor, make_deterministic_actor])
def test_exported_policy_gives_the_actors_actions_without_the_package(build, tmp_path: Path):
    torch.manual_seed(0)
    actor = build(11, 3, (32, 32))
    with torch.no_grad():  # a trained-looking actor: weights away from their initialization
        for parameter in actor.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    meta = policy_metadata(get_family("hopper"), 11, 3, [32, 32], "test", 7)
    if build is make_deterministic_actor:
        meta["actor_kind"] = "deterministic"
    save_policy(tmp_path / "policy.pt", actor, meta)
    assert (tmp_path / "policy.pt2").is_file()

    observations = [torch.randn(1, 11), torch.randn(64, 11) * 3]  # any batch size
    exported = run_plain_torch(tmp_path / "policy.pt2", observations, tmp_path)
    reloaded, _, _ = load_policy(tmp_path / "policy.pt")
    for obs, action in zip(observations, exported, strict=True):
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            expected = reloaded(TensorDict({"observation": obs}, batch_size=[obs.shape[0]]))
        assert action.shape == (obs.shape[0], 3)
        assert torch.equal(action, expected["action"])
        assert action.abs().max() <= 1.0
