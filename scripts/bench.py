"""Benchmark of the CBOP update against the machine's matmul peak (FLOPs: speed/sizes.py).

    python scripts/bench.py                      # paper and CPU-preset sizes, ~5-10 min on 2 cores
    python scripts/bench.py --quick              # CPU-preset sizes only, < 2 min
    python scripts/bench.py --device cuda --json benchmarks/bench_cuda.json  # paper sizes on a GPU

Everything is measured in ONE process, variants interleaved round by round so
that a busy machine slows them alike: ratios are what to compare.

For each size it times (ms per call, median over rounds):

- ``reference_target``: the official code's design, written in
  :mod:`benchmarks.speed.reference`: fp32, one batched matmul per ensemble
  layer, particles materialized with ``repeat``, the Q-ensemble evaluated on
  every particle at every horizon, ``var_mean`` over the ``M x K`` samples;
- ``target_fp32`` / ``target_bf16``: the project's :class:`CBOPValueEstimator`
  (``rollout_dtype`` float32 / bfloat16), and ``target_bf16_rel_error``
  ``mean|y_bf16 - y_fp32| / std(y_fp32)`` on the same batch and seed;
- ``matmul_fp32``/``matmul_bf16``: a large square matmul in the same rounds, the
  peak each size's "% peak" is taken against (the start-of-run figure is
  printed too; on a busy machine the two differ);
- ``update``: a full :class:`CBOPLoss` gradient step (fp32 target, critic with
  EDAC term, actor, alpha, Adam), ``update_bf16`` the same with bf16 rollouts
  (what ``estimator.rollout_dtype=auto`` picks where bf16 is fast and accurate,
  as on a GPU), and ``sac_update``: a stock TorchRL
  ``SACLoss`` step with the same M, the floor without model rollouts.

Every variant also gets its share of the bf16 matmul peak (``*_bf16_peak_share``,
the "% bf16" column: a GPU's headline figure). ``--device cuda`` times the paper's
sizes (``paper``: walker2d and the other tasks, M = 20; ``paper-hopper``: M = 50)
against an 8192 x 8192 matmul peak and skips the CPU-only parts.
``--sizes cpu,cpu-c2x256,cpu-c3x256b256`` times the CPU preset (3x256 critics) beside the
preset with 2x256 critics (before commit 5bc7ba6) and with the paper's batch 256 too
(docs/learning.md, Experiments 32-34) in one process.

With the CPU-preset size it also times the CBOP stage's whole step (sample, loss,
guarded Adam step, target update, metrics) now, with bf16 rollouts, at
``BEFORE_COMMIT`` and with the loss/estimator of ``PREVIOUS_COMMIT`` (both in
:mod:`benchmarks.speed.preset_step`), in gradient steps/s and in CPU
milliseconds per step (``cpu_preset_*``), and the host synchronisations per
step. ``--compile-cpu`` adds the step with
``compile=True`` (inductor) against the eager one and the compile time
(:func:`benchmarks.speed.compile_cpu.bench_compiled_target`). The JSON records
the host's CPU model and its AMX/avx512_bf16 flags
(:func:`benchmarks.speed.measure.host_cpu_info`) and a ``goals`` block: each speed
goal the run measured, met or missed by what factor and why
(:func:`benchmarks.speed.goals.speed_goals`).

FLOPs are the design's nominal count ``(H+1) K B (M f_Q + f_pi) + H K B f_f``
(``f`` = 2 x multiply-adds of one row through a network), the same for every
target variant, so GFLOP/s compare the time to do the same useful work. The
update's count adds the critic/EDAC/actor passes (about 11 B M f_Q + 3 B f_pi).

Models have random weights; the dynamics' normalization is set so that rollouts
stay in walker2d's healthy range (few terminations). Timings do not depend on
the weights.

The measurements are the modules of ``benchmarks/speed/``, one job each (sizes,
models, the reference target, the per-size timings, the preset step and its
earlier commits, compile timing, the extras, the goals, the printed figures);
this script parses the options, runs them and writes the report.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # before torch starts its thread pool; not when imported by tests
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the entry scripts (see cbop.py)
    os.environ.setdefault("RL_WARNINGS", "False")  # the losses here have no target updater

# benchmarks/ is not part of the installed package: import it from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.learning_grouping import this_machine  # noqa: E402
from benchmarks.speed.compile_cpu import bench_compiled_target  # noqa: E402
from benchmarks.speed.extras import bench_dynamics_training, bench_evaluation  # noqa: E402
from benchmarks.speed.goals import print_goals, speed_goals  # noqa: E402
from benchmarks.speed.large_dataset_run import (  # noqa: E402
    LARGE_DATASET_DYNAMICS_ROWS,
    LARGE_DATASET_MIN_ROWS,
    large_dataset_figures,
)
from benchmarks.speed.measure import (
    host_cpu_info,  # noqa: E402
    matmul_peak,  # noqa: E402
)
from benchmarks.speed.preset_step import bench_preset_steps  # noqa: E402
from benchmarks.speed.report import (  # noqa: E402
    print_compiled,
    print_extras,
    print_host,
    print_preset_steps,
    print_size,
)
from benchmarks.speed.side_by_side import bench_side_by_side, print_side_by_side  # noqa: E402
from benchmarks.speed.size_timings import bench_size  # noqa: E402
from benchmarks.speed.sizes import (  # noqa: E402
    PAPER,
    PAPER_HOPPER,
    TINY,
    cpu_deep_critics_size,
    cpu_preset_size,
    cpu_shallow_critics_size,
)
from cbop_torchrl.io import atomic_json_dump, unwritable_reason  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CPU-preset sizes only, fewer rounds, short evaluation (< 2 min)",
    )
    parser.add_argument(
        "--sizes",
        help="comma list of paper,paper-hopper,cpu,cpu-c2x256,cpu-c3x256b256,tiny (default: "
        "paper,cpu; --quick: cpu; --device cuda: paper,paper-hopper; cpu-c2x256: the CPU "
        "preset with 2x256 critics; cpu-c3x256b256: with 3x256 critics and batch 256)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="timing rounds per variant (default: 3 at the paper's sizes, 5 otherwise; quick 3)",
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile=True in the estimator and loss (CUDA: CUDA graphs; CPU: inductor)",
    )
    parser.add_argument(
        "--compiled-step",
        action="store_true",
        help="CUDA: also time the bf16 step with compile=true captured as one CUDA graph "
        "(step_bf16_captured_compiled), as training runs it with compile=true",
    )
    parser.add_argument(
        "--large-dataset",
        type=int,
        metavar="N",
        help="also run benchmarks/large_dataset.py on N transitions (D4RL full-replay: 2000000)",
    )
    parser.add_argument(
        "--large-dataset-dynamics-rows",
        type=int,
        default=LARGE_DATASET_DYNAMICS_ROWS,
        metavar="N",
        help="with --large-dataset: time the dynamics epoch on the first N rows and scale it to "
        f"all rows (default {LARGE_DATASET_DYNAMICS_ROWS:,}, as in the README; 0: all rows)",
    )
    parser.add_argument(
        "--compile-cpu",
        action="store_true",
        help="with the cpu size: also time the CBOP step with torch.compile of the target "
        "(inductor) against the eager step, fp32 and bf16, and the compile time (minutes)",
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="only time runs side by side (cbop-train runs.seeds=...): R = 1, 2, 4 runs in one "
        "one-thread process against two one-thread processes on the CPU; R = 1, 4, 12, 24 at "
        "the paper's sizes on CUDA (benchmarks/speed/side_by_side.py)",
    )
    parser.add_argument(
        "--side-by-side-steps",
        type=int,
        default=20,
        help="with --side-by-side: timed gradient steps per run (default 20)",
    )
    parser.add_argument(
        "--no-extras",
        action="store_true",
        help="skip the dynamics-training and evaluation benchmarks",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        print(f"--device {args.device!r} is not a torch device; use cpu or cuda.", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "--device cuda was given but torch sees no CUDA device; use --device cpu.",
            file=sys.stderr,
        )
        return 2
    if device.type not in ("cpu", "cuda"):
        print(f"--device {args.device!r}: only cpu and cuda are supported.", file=sys.stderr)
        return 2
    cpu = cpu_preset_size()
    known = {
        "paper": PAPER,
        "paper-hopper": PAPER_HOPPER,
        "cpu": cpu,
        "cpu-c2x256": cpu_shallow_critics_size(cpu),
        "cpu-c3x256b256": cpu_deep_critics_size(cpu),
        "tiny": TINY,
    }
    default_sizes = "cpu" if args.quick else "paper,cpu"
    if device.type == "cuda" and not args.quick:
        default_sizes = "paper,paper-hopper"
    names = (args.sizes or default_sizes).split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"--sizes: unknown size(s) {unknown}; choose from {sorted(known)}.", file=sys.stderr)
        return 2
    for flag, value in (
        ("--rounds", args.rounds),
        ("--threads", args.threads),
        ("--large-dataset", args.large_dataset),
    ):
        if value is not None and value < 1:
            print(f"{flag} {value}: give a positive integer.", file=sys.stderr)
            return 2
    rows = args.large_dataset_dynamics_rows
    if rows != 0 and rows < LARGE_DATASET_MIN_ROWS:
        print(
            f"--large-dataset-dynamics-rows {rows}: give at least {LARGE_DATASET_MIN_ROWS} rows "
            f"(one episode), or 0 for all rows (default {LARGE_DATASET_DYNAMICS_ROWS}).",
            file=sys.stderr,
        )
        return 2
    if args.json and (reason := unwritable_reason(args.json.absolute().parent)) is not None:
        print(f"--json {args.json} cannot be written: {reason}.", file=sys.stderr)
        return 2
    if args.side_by_side:
        return side_by_side_main(
            args, device, [known[name] for name in names] if args.sizes else None
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 5)
    tiny = names == ["tiny"]

    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    report: dict = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **host_cpu_info(),
        "load_average_start": list(load),
        "command": " ".join(["python", "scripts/bench.py", *(argv or sys.argv[1:])]),
    }
    matmul_n = 256 if tiny else (2048 if args.quick else 4096)
    if device.type == "cuda" and not tiny:
        matmul_n = 8192  # a GPU reaches its bf16 peak only on large products
        report["gpu"] = torch.cuda.get_device_name(device)
    report["peak_fp32_gflops"] = matmul_peak(torch.float32, matmul_n, device, rounds + 2)
    report["peak_bf16_gflops"] = matmul_peak(torch.bfloat16, matmul_n, device, rounds + 2)
    print_host(report)
    report["sizes"] = {}
    for name in names:
        size = known[name]
        size_rounds = rounds if args.rounds or size not in (PAPER, PAPER_HOPPER) else min(rounds, 3)
        result = bench_size(size, device, size_rounds, matmul_n, args.compile, args.compiled_step)
        report["sizes"][name] = result
        print_size(result)

    if "cpu" in names:
        report.update(bench_preset_steps(device, rounds))
        print_preset_steps(report)

    if args.compile_cpu and "cpu" in names:
        report.update(bench_compiled_target(device, rounds))
        print_compiled(report)

    if not args.no_extras:
        dyn_size = TINY if tiny else PAPER
        report["dynamics_training"] = bench_dynamics_training(
            device, dyn_size, 2 if tiny else (5 if args.quick else 20)
        )
        report["evaluation"] = bench_evaluation(
            2 if tiny else 10,
            5 if tiny else (50 if args.quick else 200),
            TINY.hidden if tiny else PAPER.hidden,
        )
        print_extras(report, dyn_size)
    if args.large_dataset:
        report.update(large_dataset_figures(args.large_dataset, args.large_dataset_dynamics_rows))
    report["goals"] = speed_goals(report)
    print_goals(report["goals"])
    report["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    if args.json:
        atomic_json_dump(report, args.json)
        print(f"\nwrote {args.json}")
    return 0


def side_by_side_main(args: argparse.Namespace, device: torch.device, sizes: list | None) -> int:
    """``--side-by-side``: runs side by side against one run (and two processes on the CPU)."""
    if args.side_by_side_steps < 1:
        print(f"--side-by-side-steps {args.side_by_side_steps}: give a positive integer.",
              file=sys.stderr)  # fmt: skip
        return 2
    torch.set_num_threads(args.threads or 1)
    report = bench_side_by_side(device, args.side_by_side_steps, sizes)
    report["command"] = " ".join(["python", "scripts/bench.py", *(sys.argv[1:])])
    report["machine"] = this_machine(device.type)  # what learning.py --grouping auto matches
    print_side_by_side(report)
    if args.json:
        atomic_json_dump(report, args.json)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
