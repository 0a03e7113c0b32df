"""FQE's estimate of one trained policy along the fit: does the offline score settle?

    python benchmarks/fqe_trajectory.py RUN_DIR
    python benchmarks/fqe_trajectory.py RUN_DIR --steps 50000 --tau 0.005 --every 2500

The paper's offline choice of psi ranks the candidates by FQE's
``E_{s0 ~ D}[Q_zeta(s0, pi(s0))]`` (``benchmarks/psi_grid.py --select``, which fits FQE with
the run's own FQE-stage settings). A score is only an evaluation of the policy where the fit
has settled; this script fits FQE to the run's final policy on its dataset
(:func:`cbop_torchrl.evaluation.selection.fit_policy_fqe`, the run's settings unless given
here) and prints that score every ``--every`` steps, with the spread over the last half of
the fit. It uses the data only (no environment), in a fresh temporary directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/fqe_trajectory.py` puts benchmarks/ first

from cbop_torchrl.data import load_dataset_with_info  # noqa: E402
from cbop_torchrl.evaluation.selection import (  # noqa: E402
    episode_starts,
    fit_policy_fqe,
    fqe_config_for_run,
    initial_state_value,
)
from cbop_torchrl.sweeps import policy_file  # noqa: E402
from cbop_torchrl.trainers.checkpoint import load_policy  # noqa: E402


def trajectory(
    run_dir: Path, every: int, seed: int | None = None, **overrides: float | int | None
) -> tuple[list[tuple[int, float]], dict]:
    """``(step, score)`` every ``every`` steps of an FQE fit of the run's policy; its settings."""
    config = json.loads((run_dir / "config.json").read_text())
    data, _ = load_dataset_with_info(str(config["env"]))
    actor, _, meta = load_policy(policy_file(run_dir), "cpu")
    fqe = fqe_config_for_run(config, **overrides)
    starts = data.get("observation")[episode_starts(data)]
    scores: list[tuple[int, float]] = []

    def watch(step: int, loss) -> None:
        if step % every == 0:
            scores.append((step, initial_state_value(loss, actor, starts)))
            print(f"[fqe] step {step}: {scores[-1][1]:.1f}", flush=True)

    with tempfile.TemporaryDirectory() as work_dir:
        fit_policy_fqe(
            data,
            actor,
            meta["obs_dim"],
            meta["action_dim"],
            fqe,
            int(config.get("seed", 0)) if seed is None else seed,
            Path(work_dir),
            on_step=watch,
        )
    return scores, asdict(fqe)


def settle(scores: list[tuple[int, float]]) -> dict[str, float]:
    """The last score, and the range and mean of the scores over the fit's last half."""
    last_step = scores[-1][0]
    half = [score for step, score in scores if step > last_step / 2]
    return {
        "last": scores[-1][1],
        "half_min": min(half),
        "half_max": max(half),
        "half_mean": sum(half) / len(half),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a scripts/cbop.py run directory")
    parser.add_argument("--steps", type=int, help="FQE steps (default: the run's fqe.steps)")
    parser.add_argument("--tau", type=float, help="target rate (default: the run's fqe.target_tau)")
    parser.add_argument("--lr", type=float, help="learning rate (default: the run's fqe.lr)")
    parser.add_argument("--every", type=int, default=1000, help="steps between scores")
    parser.add_argument("--seed", type=int, help="FQE's seed (default: the run's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", type=Path, help="also write the trajectory here")
    args = parser.parse_args(argv)
    if not (args.run_dir / "config.json").is_file():
        parser.exit(
            2,
            f"fqe_trajectory: {args.run_dir} has no config.json; give a run directory "
            "of scripts/cbop.py (its hydra.run.dir)\n",
        )
    torch.set_num_threads(args.threads)
    scores, settings = trajectory(
        args.run_dir, args.every, args.seed, steps=args.steps, tau=args.tau, lr=args.lr
    )
    summary = settle(scores)
    print(
        f"[fqe] {args.run_dir}: last {summary['last']:.1f}; last half of the fit "
        f"{summary['half_min']:.1f} to {summary['half_max']:.1f} (mean {summary['half_mean']:.1f})"
    )
    if args.json is not None:
        out = {"run_dir": str(args.run_dir), "settings": settings, "scores": scores, **summary}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
