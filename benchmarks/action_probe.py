"""How a trained CBOP critic values actions off the data: Q and member spread per action kind.

    python benchmarks/action_probe.py RUN_DIR [RUN_DIR ...] [--states 2048]

For a fixed sample of dataset states, prints the Q-ensemble's mean value and
its member std at the data's actions, at the policy's deterministic actions,
at uniformly random actions and at the policy's actions plus N(0, 0.3) noise.
A critic that is pessimistic off the data values random actions well below
the data's and spreads its members there.
"""

from __future__ import annotations

import argparse

import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.evaluation.analysis import load_cbop_loss
from cbop_torchrl.objectives.pretrain import ensemble_q


def probe(run_dir: str, num_states: int) -> None:
    loss, _, data, _ = load_cbop_loss(run_dir)
    generator = torch.Generator().manual_seed(0)
    batch = data[torch.randperm(data.shape[0], generator=generator)[:num_states]]
    obs, data_action = batch.get("observation"), batch.get("action")
    actor = loss.actor_network
    with loss.actor_network_params.to_module(actor):
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            policy_action = actor(TensorDict({"observation": obs}, obs.shape[:1])).get("action")
    noise = 0.3 * torch.randn(policy_action.shape, generator=generator)
    actions = {
        "data": data_action,
        "policy": policy_action,
        "uniform": torch.rand(data_action.shape, generator=generator) * 2 - 1,
        "policy+noise": (policy_action + noise).clamp(-1, 1),
    }
    for name, action in actions.items():
        td = TensorDict({"observation": obs, "action": action}, obs.shape[:1])
        with torch.no_grad():
            q = ensemble_q(loss.qvalue_network, loss.qvalue_network_params, td).squeeze(-1)
        print(
            f"{run_dir}  {name:13s} Q {float(q.mean()):7.1f}   member std "
            f"{float(q.std(0, unbiased=False).mean()):5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--states", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for run in args.runs:
        probe(run, args.states)


if __name__ == "__main__":
    main()
