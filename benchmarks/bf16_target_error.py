"""How much the bf16 rollout changes CBOP's targets, on a trained run's real data.

    python benchmarks/bf16_target_error.py runs/demo/cpu/default [--batch 256] [--batches 8]

Loads the run's CBOP loss (checkpoint weights, cached dynamics), draws dataset
batches, and computes the target twice with the same random stream: with the
rollout in float32 and in bfloat16. Prints mean |dy| / std(y) and max |dy|.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from cbop_torchrl.evaluation.analysis import load_cbop_loss  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    loss, config, data, info = load_cbop_loss(args.run_dir)
    estimator = loss.value_estimator
    generator = torch.Generator().manual_seed(args.seed)
    targets = {torch.float32: [], torch.bfloat16: []}
    for index in range(args.batches):
        rows = torch.randint(data.shape[0], (args.batch,), generator=generator)
        batch = data[rows]
        for dtype in targets:
            estimator.rollout_dtype = dtype
            with torch.random.fork_rng():
                torch.manual_seed(args.seed + index)
                target, _ = estimator.compute_target(batch)
            targets[dtype].append(target.squeeze(-1))
    y32 = torch.cat(targets[torch.float32])
    y16 = torch.cat(targets[torch.bfloat16])
    dy = (y16 - y32).abs()
    print(
        f"{info.name}: {y32.numel()} targets (H={estimator.horizon}, K={estimator.num_particles}, "
        f"M={config.agent.num_qvalue_nets}); std(y) {y32.std():.3f}, mean|dy| {dy.mean():.4f} "
        f"= {100 * dy.mean() / y32.std():.3f}% of std(y), max|dy| {dy.max():.4f}"
    )


if __name__ == "__main__":
    main()
