"""Pretraining side by side against one seed after another: wall time and agreement.

    python benchmarks/pretrain_together.py --preset cpu --seeds 0,1,2 dynamics.max_epochs=3

For each seed, the run's pretraining stages (dynamics, BC, FQE) as ``run_pipeline`` calls
them, one seed after another, in a fresh cache; then the same seeds' stages trained
together (:func:`~cbop_torchrl.trainers.pretrain_together.pretrain_together`, one stage at
a time, so each stage is timed), in another fresh cache. Prints a JSON record: each
stage's wall-clock and process CPU seconds both ways (with one torch thread the CPU
seconds are the work, whatever else the machine runs), their ratios, and the largest
absolute difference between the cached tensors of the two ways (0: the same bit for bit)
with each seed's dynamics elites and their holdout MSE both ways.
Overrides after the options are ``cbop-train``'s (``dynamics.max_epochs=3`` keeps a
CPU-preset measurement short).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cbop_torchrl.apps.api import _load, compose_config  # noqa: E402
from cbop_torchrl.cli import config_values  # noqa: E402
from cbop_torchrl.trainers import pretrain_together as together  # noqa: E402
from cbop_torchrl.trainers.decisions import StageSeeds  # noqa: E402
from cbop_torchrl.trainers.offline import (  # noqa: E402
    behaviour_cloning_stage,
    dynamics_stage,
    fitted_q_evaluation_stage,
)
from cbop_torchrl.trainers.offline_run import resolve_run_task  # noqa: E402

STAGE_FUNCTIONS = {
    "dynamics": lambda run, data: bool(dynamics_stage(run, data)[1]["cached"]),
    "bc": lambda run, data: behaviour_cloning_stage(run, data)[1],
    "fqe": lambda run, data: fitted_q_evaluation_stage(run, data)[1],
}


def load_runs(preset: str, env: str, seeds: list[int], overrides: list[str]) -> dict[str, Any]:
    """Each seed's resolved run config, and the data (loaded once per seed, as a run does)."""
    configs, info, data = [], None, None
    for seed in seeds:
        words = [f"preset={preset}", f"env={env}", "progress=false", f"seed={seed}", *overrides]
        config, info, data, _ = _load(config_values(compose_config(words)))
        configs.append(config)
    return {"configs": configs, "info": info, "data": data}


def stage_view(runs: dict[str, Any]) -> tuple[Any, Any, str]:
    """The data, info and termination the runs' stages see (as ``run_pipeline`` makes them)."""
    task, specs, info = resolve_run_task(runs["configs"][0], runs["info"])
    return specs.to_agent_actions(runs["data"]), info, task.termination


def stand_in_run(runs: dict[str, Any], config: Any) -> SimpleNamespace:
    """What the pipeline's stage functions read of an ``OfflineRun`` (CPU, no capture)."""
    _, info, termination = stage_view(runs)
    seeds = StageSeeds.of(config.seed, config.dynamics.seed)
    return SimpleNamespace(
        config=config, info=info, task=SimpleNamespace(termination=termination),
        decisions=SimpleNamespace(cuda_graph=False, seeds=seeds), device=torch.device("cpu"),
        hidden_sizes=list(config.agent.hidden_sizes), log=lambda *args: None,
        clock=SimpleNamespace(start=lambda *args: None), log_dynamics_epoch=lambda *args: None,
    )  # fmt: skip


def run_stage(runs: dict[str, Any], config: Any, stage: str) -> bool:
    """One run's ``stage`` as ``run_pipeline`` calls it; whether it came from the cache."""
    return STAGE_FUNCTIONS[stage](stand_in_run(runs, config), stage_view(runs)[0])


def cached_tensors(runs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of the runs' cache entries, by stage, seed and name."""
    data, info, termination = stage_view(runs)
    setup = together.Pretraining(info, data, termination, False, False)
    jobs = {"dynamics": together.dynamics_job, "bc": together.bc_job, "fqe": together.fqe_job}
    found = {}
    for config in runs["configs"]:
        for stage, job in jobs.items():
            directory = next(iter(job(setup, [config]).entries))
            name = "model.pt" if stage == "dynamics" else "result.pt"
            state = torch.load(directory / name, weights_only=True)
            found.update(_tensors(state, f"{stage}/seed{config.seed}"))
    return found


def _tensors(value: Any, path: str) -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {path: value}
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _tensors(item, f"{path}/{key}").items()
        }
    return {}


class Clock:
    """Wall-clock and process CPU seconds per (way, stage); the CPU seconds do not count
    the time the process waited (a busy or paused machine), which the wall seconds do."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, dict[str, float]]] = {"wall": {}, "cpu": {}}

    @contextlib.contextmanager
    def __call__(self, way: str, stage: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        for kind, now, start in (("wall", time.perf_counter(), wall),
                                 ("cpu", time.process_time(), cpu)):  # fmt: skip
            self.seconds[kind].setdefault(way, {})[stage] = now - start


def dynamics_fit(runs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each seed's cached dynamics elites and their holdout MSE (its ``metrics.json``)."""
    data, info, termination = stage_view(runs)
    setup = together.Pretraining(info, data, termination, False, False)
    fits = {}
    for config in runs["configs"]:
        directory = next(iter(together.dynamics_job(setup, [config]).entries))
        metrics = json.loads((directory / "metrics.json").read_text())
        fits[f"seed{config.seed}"] = {
            key: metrics[key] for key in ("elites", "holdout_mse_elites", "epochs")
        }
    return fits


def measure(runs: dict[str, Any], root: Path) -> dict[str, Any]:
    """Seconds per stage, one seed after another and together, and their largest difference."""
    clock = Clock()
    os.environ["CBOP_TORCHRL_CACHE"] = str(root / "one_after_another")
    for stage in together.STAGES:
        with clock("one_after_another", stage):
            for config in runs["configs"]:
                run_stage(runs, config, stage)
    alone, alone_fit = cached_tensors(runs), dynamics_fit(runs)
    os.environ["CBOP_TORCHRL_CACHE"] = str(root / "together")
    no_runs = [root / "no-run"] * len(runs["configs"])
    for stage in together.STAGES:
        with clock("together", stage):
            together.pretrain_together(
                runs["configs"], runs["info"], runs["data"], no_runs, [stage],
                device=torch.device("cpu"), cuda_graph=False,  # as stand_in_run's runs alone
            )  # fmt: skip
    joint, joint_fit = cached_tensors(runs), dynamics_fit(runs)
    difference = max(
        (joint[key].double() - value.double()).abs().max().item() if value.numel() else 0.0
        for key, value in alone.items()
    )
    report: dict[str, Any] = {
        "max_abs_difference": difference,
        "dynamics_fit": {"one_after_another": alone_fit, "together": joint_fit},
    }
    for kind, seconds in clock.seconds.items():
        totals = {way: sum(times.values()) for way, times in seconds.items()}
        report[f"{kind}_s"] = seconds
        report[f"{kind}_total_s"] = totals
        report[f"{kind}_ratio_one_after_another_to_together"] = {
            **{stage: seconds["one_after_another"][stage] / seconds["together"][stage]
               for stage in together.STAGES},
            "total": totals["one_after_another"] / totals["together"],
        }  # fmt: skip
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--env", default="demo")
    parser.add_argument(
        "--seeds", type=lambda text: [int(word) for word in text.split(",")], default=[0, 1, 2],
        help="the run seeds, comma-separated (default 0,1,2)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "overrides", nargs="*", help="cbop-train overrides, e.g. dynamics.max_epochs=3"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    runs = load_runs(args.preset, args.env, args.seeds, args.overrides)
    saved = os.environ.get("CBOP_TORCHRL_CACHE")
    try:
        with tempfile.TemporaryDirectory() as root:
            report = measure(runs, Path(root))
    finally:
        if saved is None:
            os.environ.pop("CBOP_TORCHRL_CACHE", None)
        else:
            os.environ["CBOP_TORCHRL_CACHE"] = saved
    config = runs["configs"][0]
    report["setup"] = {
        "preset": args.preset, "env": args.env, "seeds": args.seeds, "overrides": args.overrides,
        "threads": torch.get_num_threads(), "rows": int(runs["data"].shape[0]),
        "dynamics": f"{config.dynamics.num_members} members {config.dynamics.num_layers}x"
        f"{config.dynamics.hidden_size}, up to {config.dynamics.max_epochs} epochs",
        "bc_steps": config.bc.steps, "fqe_steps": config.fqe.steps,
    }  # fmt: skip
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
