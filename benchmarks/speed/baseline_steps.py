"""One gradient step of each baseline at its paper's recipe, timed in one process.

``python -m benchmarks.speed.baseline_steps`` builds every baseline as ``cbop-baseline``
does (:func:`cbop_torchrl.baselines.build_baseline`, ``configs/algo/<name>.yaml``: batch and
network sizes, state normalisation, reward scaling), on a random dataset with hopper's
sizes (11 observation and 3 action dimensions), and times its step: the losses and
:class:`~cbop_torchrl.trainers.grouped_step.GroupedOptimizationStepper`'s step (one
``torch.autograd.grad`` per optimizer group, the finite checks, Adam), then the target
networks' Polyak update. The algorithms take turns, round after round, so a load
that comes and goes reaches each alike; each one's figure is the median over its steps and
its ratio to BC's. For each it also prints the share of the step spent in matrix products
(PyTorch's profiler: ``aten::mm``, ``addmm``, ``bmm``) and the hours one run of the
protocol's budget (``--run-steps``, 60,000: CBOP's whole pipeline) takes at that pace.

CQL's step is dominated by its conservative penalty: each of the batch's states is scored by
both critics at 10 uniform actions, 10 of the policy's actions there and 10 at the next
state (``num_random``), 30 critic evaluations per state beside the TD loss's few, forward
and backward. Where CQL is timed, a ``cql-vmap`` row times it again with its critics as one
batched product (``algo.critic_passes=vmap``) beside its recipe's (``auto``: one after
another on a CPU), and the last line gives the ratio of the two.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import SoftUpdate

from cbop_torchrl.baselines import ALGOS, AlgoConfig, BaselineParts, build_baseline
from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.trainers.grouped_step import GroupedOptimizationStepper

CONFIGS = Path(__file__).resolve().parents[2] / "cbop_torchrl" / "configs" / "algo"
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def random_dataset(rows: int, obs_dim: int, act_dim: int, seed: int = 0) -> TensorDict:
    """``rows`` random transitions in the layout the baselines train on (actions in (-1, 1))."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    done = torch.zeros(rows, 1, dtype=torch.bool)
    done[99::100] = True
    return TensorDict(
        {
            "observation": normal(rows, obs_dim),
            "action": torch.rand(rows, act_dim, generator=generator) * 1.8 - 0.9,
            "next": {
                "observation": normal(rows, obs_dim),
                "reward": normal(rows, 1),
                "done": done.clone(),
                "terminated": done.clone(),
            },
        },
        [rows],
    )


def recipe(
    name: str, hidden: list[int] | None = None, batch: int | None = None, **settings: Any
) -> AlgoConfig:
    """The baseline's ``configs/algo/<name>.yaml``, with its sizes replaced where given and
    ``settings`` over its other values."""
    values = {**yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()), **settings}
    if hidden is not None:
        values["hidden_sizes"] = hidden
    if batch is not None:
        values["batch_size"] = batch
    return AlgoConfig.from_dict(values)


def cpu_preset() -> RunConfig:
    """``cbop-baseline preset=cpu``'s resolved settings (its learning rates where a recipe
    leaves one to the preset)."""
    from cbop_torchrl.apps.api import compose_config
    from cbop_torchrl.cli import config_values

    values = config_values(compose_config(["preset=cpu"], "baseline"))
    values.pop("algo", None)
    values["estimator"]["psi"] = 0.0  # CBOP's, unused by a baseline
    return load_config(values, lambda env: ("hopper", "hopper-bench"))[0]


class BaselineStep:
    """One baseline's gradient step on batches of its recipe's size from ``data``."""

    def __init__(
        self, algo: AlgoConfig, config: RunConfig, data: TensorDict, seed: int = 0
    ) -> None:
        info = DatasetInfo("hopper-bench", "random", data.shape[0], "hdf5",
                           obs_dim=data["observation"].shape[-1],
                           action_dim=data["action"].shape[-1])  # fmt: skip
        torch.manual_seed(seed)
        self.algo = algo
        self.parts: BaselineParts = build_baseline(algo, config, info, torch.device("cpu"), data)
        optimizer = torch.optim.Adam(
            [{"params": params, "lr": lr} for _, params, lr, _ in self.parts.groups]
        )
        # What the stepper reads of TorchRL's Trainer: the loss, the optimizer, the step count.
        self.trainer = SimpleNamespace(
            compute_loss=self.parts.loss, optimizer=optimizer, _optim_count=0
        )
        schedule = config.train.total_steps if algo.actor_lr_schedule == "cosine" else None
        # No checkpoint (None): the stepper reads it only to name the last good one when a
        # step is non-finite, which a benchmark on random data does not recover from anyway.
        self.stepper = GroupedOptimizationStepper(self.parts.groups, None, algo.name, schedule)
        self.target = SoftUpdate(self.parts.loss, tau=0.005) if self.parts.has_targets else None
        self.data, self.batch = data, int(algo.batch_size)
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self) -> TensorDictBase:
        rows = torch.randint(self.data.shape[0], (self.batch,), generator=self.generator)
        return self.data[rows]

    def __call__(self) -> None:
        self.stepper.step(self.trainer, self.sample())
        if self.target is not None:
            self.target.step()
        self.trainer._optim_count += 1


def critics_run(step: BaselineStep) -> str | None:
    """How CQL's loss runs its critics in ``step`` (``loop`` or ``vmap``); None for the others."""
    if step.algo.name != "cql":
        return None
    return "loop" if step.parts.loss.deactivate_vmap else "vmap"


def matmul_share(step: BaselineStep, steps: int) -> float:
    """The share of ``steps`` steps' CPU time in matrix products (the profiler's self time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    matmul = sum(event.self_cpu_time_total for event in events if event.key in MATMULS)
    return matmul / total if total else 0.0


def bench(
    algos: tuple[str, ...] = ALGOS,
    rounds: int = 10,
    steps_per_round: int = 3,
    rows: int = 5000,
    run_steps: int = 60_000,
    hidden: list[int] | None = None,
    batch: int | None = None,
    profile_steps: int = 3,
) -> dict:
    """Milliseconds per gradient step of each of ``algos``, taking turns for ``rounds`` rounds."""
    data, config = random_dataset(rows, 11, 3), cpu_preset()
    steps = {name: BaselineStep(recipe(name, hidden, batch), config, data) for name in algos}
    if "cql" in steps:  # its critics as one batched product, against the recipe's auto
        steps["cql-vmap"] = BaselineStep(recipe("cql", hidden, batch, critic_passes="vmap"),
                                         config, data)  # fmt: skip
    for step in steps.values():  # warm-up: first calls allocate and pick kernels
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(steps_per_round):
                step()
            times[name].append((time.perf_counter() - start) / steps_per_round * 1e3)
    reference = statistics.median(times[algos[0]])
    result: dict = {
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "run_steps": run_steps,
        "reference": algos[0],
        "algos": {},
    }
    for name, step in steps.items():
        ms = statistics.median(times[name])
        result["algos"][name] = {
            "critics": critics_run(step),
            "batch_size": step.batch,
            "hidden_sizes": list(step.algo.hidden_sizes or []),
            "step_ms": ms,
            "ratio_to_reference": ms / reference,
            "matmul_share": matmul_share(step, profile_steps) if profile_steps else None,
            "run_hours": ms * run_steps / 3.6e6,
        }
    return result


def report(result: dict) -> str:
    """The table ``bench`` measured, one line per baseline."""
    lines = [
        f"one gradient step per baseline, {result['threads']} torch thread(s), median of "
        f"{result['rounds']} rounds of {result['steps_per_round']} steps, taking turns",
        f"{'algo':<9} {'batch':>5} {'hidden':<16} {'critics':<7} {'ms/step':>8} "
        f"{'x ' + result['reference']:>6} {'matmul':>7} {'h/run':>6}",
    ]
    for name, row in result["algos"].items():
        share = "" if row["matmul_share"] is None else f"{row['matmul_share']:.0%}"
        lines.append(
            f"{name:<9} {row['batch_size']:>5} {str(row['hidden_sizes']):<16} "
            f"{row['critics'] or '':<7} "
            f"{row['step_ms']:>8.1f} {row['ratio_to_reference']:>6.2f} {share:>7} "
            f"{row['run_hours']:>6.2f}"
        )
    rows = result["algos"]
    if "cql" in rows and "cql-vmap" in rows:
        lines.append(
            f"cql: its recipe's critic_passes (auto: {rows['cql']['critics']} on a CPU) at "
            f"{rows['cql']['step_ms'] / rows['cql-vmap']['step_ms']:.2f} x the batched (vmap) step"
        )
    lines.append(f"h/run: hours for {result['run_steps']:,} steps at this pace")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["bc", *[a for a in ALGOS if a != "bc"]],
                        choices=ALGOS, help="the first is the reference of the ratios")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the lanes': 1)")
    parser.add_argument("--run-steps", type=int, default=60_000)
    parser.add_argument("--hidden", type=int, nargs="+", help="replace every recipe's widths")
    parser.add_argument("--batch", type=int, help="replace every recipe's batch")
    parser.add_argument("--profile-steps", type=int, default=3, help="0: no matmul share")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if min(args.rounds, args.steps_per_round, args.threads, args.run_steps) < 1:
        parser.error("--rounds, --steps-per-round, --threads and --run-steps must be >= 1")
    torch.set_num_threads(args.threads)
    result = bench(
        tuple(args.algos), args.rounds, args.steps_per_round, run_steps=args.run_steps,
        hidden=args.hidden, batch=args.batch, profile_steps=args.profile_steps,
    )  # fmt: skip
    print(report(result))
    if args.out is not None:
        from cbop_torchrl.io import atomic_json_dump

        atomic_json_dump(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
