"""The CBOP step's dispatched operations and the CPU preset's steps/s, now against a commit.

    python -m benchmarks.speed.step_ops                 # against OPS_BASE_COMMIT
    python -m benchmarks.speed.step_ops --commit abc123 --rounds 7

Both in one process: the step's operations at the paper's sizes (bf16 rollouts, fused
Adam and the target update: ``step_dispatched_ops`` of ``scripts/bench.py --device
cuda``, counted on the CPU, where the same eager step dispatches the same operations),
then the CPU preset's gradient step (sample, step, target update) now and with the
commit's estimator, loss and step function (loaded from git), interleaved round by round,
in steps/s, with the ratio. The two steps compute the same numbers
(``tests/test_step_ops.py``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import types
import warnings
from collections.abc import Callable

import torch
from torchrl.objectives import SoftUpdate

from benchmarks.speed.measure import time_interleaved
from benchmarks.speed.models import build_models, preset_dataset
from benchmarks.speed.preset_step import load_before_modules
from benchmarks.speed.size_timings import dispatched_ops
from benchmarks.speed.sizes import PAPER, Size, cpu_preset_size, env_sizes
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import action_spec

#: The last commit before the step's operations were cut (issue 53).
OPS_BASE_COMMIT = "f05e2ab"
#: The modules of the step, loaded from the commit (the old loss imports the old estimator).
STEP_MODULES = (
    ("objectives.estimator", "cbop_torchrl/objectives/estimator.py"),
    ("objectives.loss", "cbop_torchrl/objectives/loss.py"),
    ("trainers.update", "cbop_torchrl/trainers/update.py"),
)


def current_modules() -> dict[str, types.ModuleType]:
    """This checkout's step modules, keyed as :data:`STEP_MODULES`."""
    from cbop_torchrl.objectives import estimator, loss
    from cbop_torchrl.trainers import update

    return {"objectives.estimator": estimator, "objectives.loss": loss, "trainers.update": update}


def make_step(
    modules: dict[str, types.ModuleType],
    size: Size,
    device: torch.device,
    rollout_dtype: str,
    models: tuple | None = None,
) -> tuple[torch.nn.Module, Callable]:
    """``(loss, step)``: the CBOP step of ``modules`` at ``size`` (fused Adam, soft update).

    ``models`` (:func:`build_models`' actor, Q-networks and dynamics) are deep-copied, so
    two steps built on the same models start from the same parameters.
    """
    actor, qnets, dynamics, _ = models or build_models(size, device)
    _, act_dim = env_sizes(size.family)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No target network updater")
        loss = modules["objectives.loss"].CBOPLoss(
            copy.deepcopy(actor), copy.deepcopy(qnets), dynamics,
            action_spec=action_spec(act_dim, device), horizon=size.horizon,
            rollout_dtype=rollout_dtype,
        ).to(device)  # fmt: skip
    optimizer = torch.optim.Adam(
        loss.parameters(), lr=3e-4, fused=True, capturable=device.type == "cuda"
    )
    step = modules["trainers.update"].GradientStep(loss, optimizer, SoftUpdate(loss, tau=0.005))
    return loss, step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default=OPS_BASE_COMMIT, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--steps-per-round", type=int, default=10)
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    base = load_before_modules(args.commit, STEP_MODULES)
    if base is None:
        print(f"cannot load {args.commit} from git", file=sys.stderr)
        return 2
    now = current_modules()

    paper_models = build_models(PAPER, device)
    batch = paper_models[3]
    ops = {}
    for name, modules in (("before", base), ("now", now)):
        _, step = make_step(modules, PAPER, device, "bfloat16", paper_models)
        ops[name] = dispatched_ops(lambda step=step: step(batch))
    print(
        f"operations per paper-size bf16 step: {ops['before']} at {args.commit}, {ops['now']} "
        f"now ({ops['now'] / ops['before']:.2f}x)"
    )

    size = cpu_preset_size()
    preset_models = build_models(size, device)
    buffer = make_replay_buffer(preset_dataset(size, device), size.batch, device=device, seed=0)
    calls = {}
    for name, modules in (("before", base), ("now", now)):
        _, step = make_step(modules, size, device, "float32", preset_models)

        def run(step=step) -> None:
            for _ in range(args.steps_per_round):
                step(buffer.sample())

        calls[name] = run
    seconds = time_interleaved(calls, args.rounds, device)
    rates = {name: args.steps_per_round / value for name, value in seconds.items()}
    print(
        f"CPU preset steps/s (fp32 rollouts, {torch.get_num_threads()} threads): "
        f"{rates['before']:.2f} at {args.commit}, {rates['now']:.2f} now "
        f"({rates['now'] / rates['before']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
