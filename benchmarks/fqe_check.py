"""FQE's score of each psi grid policy against the policy's true value at the same states.

    python benchmarks/fqe_check.py --datasets hopper-medium-replay-gen
    python benchmarks/fqe_check.py --datasets hopper-medium-replay-gen --states 200 --threads 1

The paper chooses psi by FQE's estimate of ``E_{s0 ~ D}[Q_zeta(s0, pi(s0))]``, the value of the
trained policy at the dataset's initial states (appendix, "Offline Hyperparameter Selection via
FQE"). ``benchmarks/psi_grid.py --select`` stores that score per grid run in
``<set>/psi_selection.json``. This script measures, for every stored run whose directory is on
this machine, what FQE estimates: the discounted return (the run's gamma) of the deterministic
policy from ``--states`` of the dataset's initial states (drawn with seed 0, restored in the
real environment; the stored FQE score averages over every initial state, which these states
sample), and beside it the run's own critic ``Q_phi`` at those states. It uses the
environment, so it is a diagnosis of the choice, never a part of it.

Prints one table per set (psi, seed, FQE, MC, FQE - MC, Q_phi - MC, the online final) and
Spearman's rho of the candidates' orders (mean over their checked seeds): FQE against MC (is
FQE's estimate the problem?) and MC against the online final (does the discounted value at
the initial states rank the policies as the episode score does?). Writes
``<results>/<set>/fqe_check.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/fqe_check.py` puts benchmarks/, not the root

from benchmarks.cbop_row import SELECTION_NAME, SETS, grid_rows  # noqa: E402
from benchmarks.psi_grid import mean  # noqa: E402
from cbop_torchrl.envs.task import resolve_task  # noqa: E402
from cbop_torchrl.evaluation.analysis import load_cbop_loss  # noqa: E402
from cbop_torchrl.evaluation.selection import episode_starts, spearman_rho  # noqa: E402
from cbop_torchrl.io import atomic_json_dump  # noqa: E402
from cbop_torchrl.trainers.conservatism import dataset_conservatism  # noqa: E402

CHECK_NAME = "fqe_check.json"
CHECK_FORMAT = "cbop-torchrl-fqe-check/1"
STATES_SEED = 0


def initial_states(data: Any, count: int, seed: int = STATES_SEED) -> torch.Tensor:
    """``count`` of the dataset's episode-opening observations ``[count, O]`` (all if fewer)."""
    starts = data.get("observation")[episode_starts(data)].float()
    generator = torch.Generator().manual_seed(seed)
    return starts[torch.randperm(starts.shape[0], generator=generator)[:count]]


@torch.no_grad()
def true_values(run_dir: Path, count: int) -> dict[str, float]:
    """The policy's discounted Monte-Carlo return and its critic's ``Q_phi`` at initial states
    (the conservatism measurement, :func:`dataset_conservatism`, at the episode starts)."""
    loss, config, data, info = load_cbop_loss(run_dir)
    obs = initial_states(data, count)
    # alpha 0: the plain return, as FQE estimates it (no entropy part)
    numbers = dataset_conservatism(
        loss, resolve_task(config.task, info), obs, config.agent.gamma, 0.0, config.eval.max_steps
    )
    return {
        "states": numbers["states"],
        "gamma": numbers["gamma"],
        "mc_value": numbers["mc_return_mean"],
        "mc_value_std": numbers["mc_return_std"],
        "episode_length_mean": numbers["episode_length_mean"],
        "q_phi": numbers["predicted_q_mean"],
    }


def check(results: Path, dataset: str, count: int) -> dict[str, Any] | None:
    """Every stored FQE score of the set's grid runs beside the policy's measured value."""
    path = results / dataset / SELECTION_NAME
    if not path.is_file():
        print(f"fqe_check: {dataset} has no {SELECTION_NAME}; run benchmarks/psi_grid.py --select")
        return None
    scored = json.loads(path.read_text()).get("fqe_per_run", {})
    runs = []
    for psi, (variant, found) in sorted(grid_rows(results, dataset).items()):
        for seed, summary in sorted(found.items()):
            entry = scored.get(f"{variant}/seed{seed}")
            run_dir = Path(entry["run_dir"]) if entry else None
            if run_dir is None or not (run_dir / "config.json").is_file():
                continue
            print(f"[fqe_check] {dataset} psi {psi:g} seed {seed}: {run_dir}", flush=True)
            runs.append(
                {
                    "psi": psi,
                    "variant": variant,
                    "seed": seed,
                    "run_dir": str(run_dir),
                    "fqe_value": entry["fqe_value"],
                    "final": summary.get("final_normalized_score"),
                    **true_values(run_dir, count),
                }
            )
    by_psi: dict[float, list[dict]] = {}
    for run in runs:
        by_psi.setdefault(run["psi"], []).append(run)
    means = {
        psi: {key: mean([r[key] for r in rs]) for key in ("fqe_value", "mc_value", "final")}
        for psi, rs in by_psi.items()
    }
    order = sorted(means)
    column = {key: [means[psi][key] for psi in order] for key in ("fqe_value", "mc_value", "final")}
    out = {
        "format": CHECK_FORMAT,
        "dataset": dataset,
        "states_seed": STATES_SEED,
        "runs": runs,
        "per_psi": [{"psi": psi, "seeds": len(by_psi[psi]), **means[psi]} for psi in order],
        "spearman_fqe_mc": spearman_rho(column["fqe_value"], column["mc_value"]),
        "spearman_mc_final": spearman_rho(column["mc_value"], column["final"]),
        "spearman_fqe_final": spearman_rho(column["fqe_value"], column["final"]),
    }
    atomic_json_dump(out, results / dataset / CHECK_NAME)
    return out


def _rho(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def table(out: dict[str, Any]) -> str:
    lines = [
        f"## {out['dataset']}: FQE against the policy's discounted return at initial states",
        "",
        "| psi | seed | FQE | MC | FQE - MC | Q_phi - MC | episode length | final |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in out["runs"]:
        lines.append(
            f"| {r['psi']:g} | {r['seed']} | {r['fqe_value']:.1f} | {r['mc_value']:.1f} "
            f"| {r['fqe_value'] - r['mc_value']:+.1f} | {r['q_phi'] - r['mc_value']:+.1f} "
            f"| {r['episode_length_mean']:.0f} | {r['final']:.1f} |"
        )
    lines += [
        "",
        f"Spearman's rho over psi (means over seeds): FQE vs MC {_rho(out['spearman_fqe_mc'])}, "
        f"MC vs final {_rho(out['spearman_mc_final'])}, "
        f"FQE vs final {_rho(out['spearman_fqe_final'])}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--states", type=int, default=100, help="initial states rolled out")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.states < 1:
        parser.exit(2, f"fqe_check: --states {args.states}: give at least 1 initial state\n")
    torch.set_num_threads(args.threads)
    for dataset in args.datasets:
        out = check(args.results, dataset, args.states)
        if out is not None:
            print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
