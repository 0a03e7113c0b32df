"""The CBOP step's dispatched operations and the CPU preset's steps/s, now against a commit.

    python -m benchmarks.speed.step_ops                 # against OPS_CUT_COMMIT
    python -m benchmarks.speed.step_ops --commit abc123 --rounds 7
    python -m benchmarks.speed.step_ops --small --compiled   # and with the target compiled

Both in one process: the step's operations at the paper's sizes (bf16 rollouts, fused
Adam and the target update: ``step_dispatched_ops`` of ``scripts/bench.py --device
cuda``, counted on the CPU, where the same eager step dispatches the same operations) at
M = 20 (walker2d) and M = 50 (hopper), with the Q-ensemble in a CPU's row blocks and in a
CUDA run's (one block at these sizes), now and at the commit; then the CPU preset's
gradient step (sample, step, target update) now and with the commit's step modules (loaded
from git), interleaved round by round, in steps/s, with the ratio. The two steps compute the
same numbers (``tests/test_step_ops.py``). ``--compiled`` adds the step with ``compile=true``
(the CBOP target compiled by inductor, one graph): its count (:func:`compiled_ops`: the
operations still dispatched plus one per call of a generated kernel, one launch each on
CUDA) and its steps/s at the CPU preset.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import subprocess
import sys
import types
import warnings
from collections.abc import Callable

import torch
from torchrl.objectives import SoftUpdate

from benchmarks.speed import REPO
from benchmarks.speed.measure import time_interleaved
from benchmarks.speed.models import build_models, preset_dataset
from benchmarks.speed.size_timings import compiled_ops, dispatched_ops
from benchmarks.speed.sizes import PAPER, PAPER_HOPPER, Size, cpu_preset_size, env_sizes
from cbop_torchrl.accel.plans import DEFAULT_CUDA_Q_CHUNK_ROWS, DEFAULT_Q_CHUNK_ROWS
from cbop_torchrl.accel.rollout_dtype import native_bf16_matmul
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import action_spec

#: The last commit before the step's operations were first cut (1,800 operations per
#: paper-size step at M = 20).
OPS_BASE_COMMIT = "f05e2ab"
#: The last commit before the second cut (1,544 operations): the rollout on tensors, the
#: actor's addmm + ReLU as one operation, ReLUs under autograd that save no output, the
#: Q-ensemble's blocks, detached parameters and the target update without per-tensor work.
OPS_CUT_COMMIT = "122e977"
#: The modules of the step, in import order, loaded from a commit (each later one imports
#: the earlier ones of the same commit; a module the commit lacks is this checkout's). The
#: paths are the commits': this checkout has the fast paths in cbop_torchrl/accel
#: (:func:`current_modules`).
STEP_MODULES = (
    # a commit's estimator imports names of its own rollout_dtype that have since gone
    ("objectives.rollout_dtype", "cbop_torchrl/objectives/rollout_dtype.py"),
    ("modules.fused_mlp", "cbop_torchrl/modules/fused_mlp.py"),
    ("modules.dynamics", "cbop_torchrl/modules/dynamics.py"),
    ("objectives.fast_paths", "cbop_torchrl/objectives/fast_paths.py"),
    ("objectives.cbop_target", "cbop_torchrl/objectives/cbop_target.py"),
    ("objectives.cbop_settings", "cbop_torchrl/objectives/cbop_settings.py"),
    ("objectives.estimator", "cbop_torchrl/objectives/estimator.py"),
    ("objectives.loss", "cbop_torchrl/objectives/loss.py"),
    ("trainers.update", "cbop_torchrl/trainers/update.py"),
)


def current_modules() -> dict[str, types.ModuleType]:
    """This checkout's step modules, keyed as :data:`STEP_MODULES`.

    The step is the one ``cbop-train`` runs: the accelerated loss and estimator
    (:mod:`cbop_torchrl.accel`) under the keys of the commits' ``objectives.loss`` and
    ``objectives.estimator``, whose classes had the fast paths built in.
    """
    from cbop_torchrl.accel import estimator, fused_mlp, loss, rollout_dtype
    from cbop_torchrl.accel import plans as fast_paths
    from cbop_torchrl.modules import dynamics
    from cbop_torchrl.objectives import cbop_settings, cbop_target
    from cbop_torchrl.trainers import update

    return {
        "objectives.rollout_dtype": rollout_dtype,
        "modules.fused_mlp": fused_mlp,
        "modules.dynamics": dynamics,
        "objectives.fast_paths": fast_paths,
        "objectives.cbop_target": cbop_target,
        "objectives.cbop_settings": cbop_settings,
        "objectives.estimator": estimator,
        "objectives.loss": loss,
        "trainers.update": update,
    }


def load_step_modules(commit: str) -> dict[str, types.ModuleType] | None:
    """The ``commit`` versions of :data:`STEP_MODULES` (those it has), or None without git."""
    loaded: dict[str, types.ModuleType] = {}
    prefix = f"cbop_{commit}"
    # The commit's own helpers first where it has them: its modules import them by a name
    # that may no longer exist in this checkout (cbop_torchrl.utils).
    for short, path in (("utils", "cbop_torchrl/utils.py"), *STEP_MODULES):
        try:
            source = subprocess.run(
                ["git", "-C", str(REPO), "show", f"{commit}:{path}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        except OSError:
            return None
        except subprocess.CalledProcessError:
            if short in ("objectives.estimator", "objectives.loss", "trainers.update"):
                return None  # not a step this benchmark knows
            continue  # a module the commit does not have: this checkout's
        for other in loaded:  # the commit's own versions of the modules loaded before
            source = source.replace(f"cbop_torchrl.{other}", f"{prefix}.{other}")
        module = types.ModuleType(f"{prefix}.{short}")
        sys.modules[module.__name__] = module
        exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
        loaded[short] = module
    return loaded


def _own_dynamics(dynamics, modules: dict[str, types.ModuleType], device: torch.device):
    """``dynamics`` rebuilt from ``modules``' DynamicsModel (same weights), if it is another's."""
    own = modules.get("modules.dynamics")
    if own is None or isinstance(dynamics, own.DynamicsModel):
        return dynamics
    ensemble = own.GaussianEnsemble(**dynamics.ensemble.architecture())
    ensemble.load_state_dict(dynamics.ensemble.state_dict())
    elites = dynamics.elite_indices.tolist()
    model = own.DynamicsModel(
        ensemble, dynamics.termination, elites, mode=dynamics.mode, per_member=dynamics.per_member
    )
    return model.to(device)


def make_step(
    modules: dict[str, types.ModuleType],
    size: Size,
    device: torch.device,
    rollout_dtype: str,
    models: tuple | None = None,
    q_chunk_rows: int | None = DEFAULT_Q_CHUNK_ROWS,
    compile: bool = False,
) -> tuple[torch.nn.Module, Callable]:
    """``(loss, step)``: the CBOP step of ``modules`` at ``size`` (fused Adam, soft update).

    ``models`` (:func:`build_models`' actor, Q-networks and dynamics) are deep-copied (the
    dynamics rebuilt from ``modules``' own classes), so two steps built on the same models
    start from the same parameters. ``q_chunk_rows``: the Q-ensemble's rows per block
    (a CPU's by default). ``compile``: the loss's ``compile=True`` (inductor on a CPU).
    """
    actor, qnets, dynamics, _ = models or build_models(size, device)
    dynamics = _own_dynamics(dynamics, modules, device)
    _, act_dim = env_sizes(size.family)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No target network updater")
        loss = modules["objectives.loss"].CBOPLoss(
            copy.deepcopy(actor), copy.deepcopy(qnets), dynamics,
            action_spec=action_spec(act_dim, device), horizon=size.horizon,
            rollout_dtype=rollout_dtype, **({"compile": True} if compile else {}),
        ).to(device)  # fmt: skip
    loss.value_estimator.q_chunk_rows = q_chunk_rows
    optimizer = torch.optim.Adam(
        loss.parameters(), lr=3e-4, fused=True, capturable=device.type == "cuda"
    )
    step = modules["trainers.update"].GradientStep(loss, optimizer, SoftUpdate(loss, tau=0.005))
    return loss, step


def q_rows(size: Size) -> int:
    """The rollout's Q-ensemble rows per step: ``B (1 + H K)``."""
    return size.batch * (1 + size.horizon * size.particles)


def op_structure(size: Size, batch: int = 16, width: int = 32) -> tuple[Size, dict[str, int]]:
    """``size`` with a small batch and small widths, and the row blocks that keep its operations.

    What a step dispatches depends on K, M, H, the layers, the task (its termination) and the
    Q-ensemble's number of row blocks, not on B or the widths: returns the small size and,
    for ``"cpu"`` and ``"cuda"``, the ``q_chunk_rows`` that give it the blocks ``size`` has
    on a CPU and on CUDA (``tests/test_step_ops.py`` checks the counts agree).
    """
    small = dataclasses.replace(
        size,
        batch=batch,
        hidden=(width,) * len(size.hidden),
        dyn_hidden=(width,) * len(size.dyn_hidden),
        critic_hidden=None if size.critic_hidden is None else (width,) * len(size.critic_hidden),
    )
    rows, small_rows = q_rows(size), q_rows(small)
    chunks = {}
    for device, default in (("cpu", DEFAULT_Q_CHUNK_ROWS), ("cuda", DEFAULT_CUDA_Q_CHUNK_ROWS)):
        blocks = math.ceil(rows / default)
        chunks[device] = math.ceil(small_rows / blocks)
        assert math.ceil(small_rows / chunks[device]) == blocks, (size, device)
    return small, chunks


def count_ops(
    modules: dict[str, types.ModuleType], size: Size, q_chunk_rows: int, models: tuple
) -> int:
    """Operations one warm bf16 step of ``modules`` at ``size`` dispatches on the CPU."""
    _, step = make_step(modules, size, torch.device("cpu"), "bfloat16", models, q_chunk_rows)
    batch = models[3]
    return dispatched_ops(lambda: step(batch))


def count_compiled_ops(size: Size, q_chunk_rows: int, models: tuple) -> dict[str, int]:
    """:func:`compiled_ops` of one warm bf16 step with ``compile=True`` (the target compiled).

    The CPU's inductor kernels stand for a GPU's: each fused kernel one operation.
    """
    cpu = torch.device("cpu")
    _, step = make_step(current_modules(), size, cpu, "bfloat16", models, q_chunk_rows, True)
    batch = models[3]
    return compiled_ops(lambda: step(batch))


def print_counts(args: argparse.Namespace, base: dict, now: dict) -> None:
    """The paper sizes' operation counts, at ``args.commit`` and now (and compiled)."""
    device = torch.device("cpu")
    for name, paper in (("M = 20, walker2d", PAPER), ("M = 50, hopper", PAPER_HOPPER)):
        size, chunks = op_structure(paper) if args.small else (paper, None)
        if chunks is None:
            chunks = {"cpu": DEFAULT_Q_CHUNK_ROWS, "cuda": DEFAULT_CUDA_Q_CHUNK_ROWS}
        models = build_models(size, device)
        before = count_ops(base, size, chunks["cpu"], models)
        cpu = count_ops(now, size, chunks["cpu"], models)
        cuda = count_ops(now, size, chunks["cuda"], models)
        print(
            f"operations per paper-size bf16 step, {name}: {before} at {args.commit}, "
            f"{cpu} now ({cpu / before:.2f}x); {cuda} with a CUDA run's Q-ensemble blocks",
            flush=True,
        )
        if args.compiled:
            parts = {key: count_compiled_ops(size, rows, models) for key, rows in chunks.items()}
            cpu, cuda = parts["cpu"], parts["cuda"]
            print(
                f"  with compile=true (the target by inductor): {cpu['total']} "
                f"({cpu['dispatched']} dispatched + {cpu['kernels']} generated kernels); "
                f"{cuda['total']} ({cuda['dispatched']} + {cuda['kernels']}) with a CUDA "
                "run's blocks",
                flush=True,
            )


def timed_dtypes(device: torch.device, force_bf16: bool) -> tuple[str, ...]:
    """The rollout dtypes to time: bf16 only where ``rollout_dtype=auto`` could choose it.

    On a CPU without AMX-BF16 or AVX512-BF16 the bf16 matmuls are emulated, tens of
    times slower than fp32, and no run of the preset uses them there.
    """
    native, reason = native_bf16_matmul(device)
    if native or force_bf16:
        return ("float32", "bfloat16")
    print(f"bf16 rollouts not timed ({reason}; --bf16 times them anyway)", flush=True)
    return ("float32",)


def time_preset(args: argparse.Namespace, base: dict, now: dict) -> None:
    """The CPU preset's steps/s at ``args.commit`` and now (and compiled), interleaved."""
    device = torch.device("cpu")
    size = cpu_preset_size()
    preset_models = build_models(size, device)
    buffer = make_replay_buffer(preset_dataset(size, device), size.batch, device=device, seed=0)
    names = [("before", base, False), ("now", now, False)]
    if args.compiled:
        names.append(("compiled", now, True))
    dtypes = timed_dtypes(device, args.bf16)
    variants = [(*name, dtype) for dtype in dtypes for name in names]
    calls = {}
    for name, modules, compile, dtype in variants:
        _, step = make_step(modules, size, device, dtype, preset_models, compile=compile)

        def run(step=step) -> None:
            for _ in range(args.steps_per_round):
                step(buffer.sample())

        if compile:
            run()  # compiles outside the timed rounds
        calls[name, dtype] = run
    seconds = time_interleaved(calls, args.rounds, device)
    rates = {key: args.steps_per_round / value for key, value in seconds.items()}
    for dtype in dtypes:
        before, after = rates["before", dtype], rates["now", dtype]
        print(
            f"CPU preset steps/s ({dtype} rollouts, {torch.get_num_threads()} threads): "
            f"{before:.2f} at {args.commit}, {after:.2f} now ({after / before:.2f}x)"
        )
        if args.compiled:
            compiled = rates["compiled", dtype]
            print(f"  with compile=true: {compiled:.2f} ({compiled / after:.2f}x now)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default=OPS_CUT_COMMIT, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument(
        "--small",
        action="store_true",
        help="count at op_structure()'s small sizes (same operations, seconds not minutes)",
    )
    parser.add_argument("--no-counts", action="store_true", help="time the CPU preset only")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also count and time the step with compile=true (inductor; minutes per compile)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="time bf16 rollouts even where the CPU emulates bf16 matmuls",
    )
    args = parser.parse_args(argv)
    base = load_step_modules(args.commit)
    if base is None:
        print(f"cannot load {args.commit} from git", file=sys.stderr)
        return 2
    now = current_modules()
    if not args.no_counts:
        print_counts(args, base, now)
    time_preset(args, base, now)
    return 0


if __name__ == "__main__":
    sys.exit(main())
