"""The CBOP stage's step with ``compile=True`` (inductor) on a CPU against the eager step."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import torch

from benchmarks.speed.measure import relative_error, seeded_target, time_interleaved
from benchmarks.speed.models import build_models, preset_dataset
from benchmarks.speed.preset_step import after_step, preset_loss
from benchmarks.speed.sizes import cpu_preset_size
from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import make_actor


def _cpu_seconds_with_children() -> float:
    """User + system CPU seconds of this process and its finished children (compile workers)."""
    import resource

    own, children = (resource.getrusage(who) for who in (0, -1))  # RUSAGE_SELF, _CHILDREN
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_compiled_target(
    device: torch.device,
    rounds: int,
    steps_per_round: int = 10,
    main_job_steps: int = 4000,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
) -> dict:
    """``CBOPLoss(compile=True)`` on a CPU (inductor, static shapes) at the CPU preset.

    ``compile=True`` compiles the tensor part of :meth:`CBOPValueEstimator.compute_target`
    (actor, dynamics and Q-ensemble rollout, returns, posterior; one graph, no breaks).
    Times the CBOP stage's whole step with it against the eager step in the same process,
    for each rollout dtype in ``dtypes``, and checks the targets on one batch with the
    same seed (random draws are eager ones; in bf16 also each against the eager fp32
    target, ``*_target_bf16_rel_error``). The
    compile time is measured from an empty inductor cache (a temporary
    ``TORCHINDUCTOR_CACHE_DIR``), the first dtype's being a first compile in the process,
    and again for the first dtype from the filled cache after ``torch._dynamo.reset()``
    (``compile_s_warm``; a later process reads the same cache from disk).
    ``compile_break_even_steps``: steps after which the CPU time saved per step repays
    the compile's CPU time (cold).
    """
    import torch._dynamo

    size = cpu_preset_size()
    _, _, dynamics, _ = build_models(size, device)
    buffer = make_replay_buffer(preset_dataset(size, device), size.batch, device=device, seed=0)
    check_batch = buffer.sample()
    suffixes = {"float32": "", "bfloat16": "_bf16"}
    result: dict = {"compile_main_job_steps": main_job_steps, "compile_order": list(dtypes)}
    steps: dict[str, Callable[[], None]] = {}
    previous_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    def compiled_loss(dtype: str):
        return preset_loss(CBOPLoss, make_actor, size, dynamics, device, dtype, compile=True)

    def first_call(loss, suffix: str) -> None:
        start, cpu_start = time.perf_counter(), _cpu_seconds_with_children()
        with torch.random.fork_rng():
            loss.value_estimator.compute_target(check_batch)
        result[f"compile_s{suffix}"] = time.perf_counter() - start
        result[f"compile_cpu_s{suffix}"] = _cpu_seconds_with_children() - cpu_start

    try:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            for dtype in dtypes:
                suffix = suffixes[dtype]
                eager = preset_loss(CBOPLoss, make_actor, size, dynamics, device, dtype)
                compiled = compiled_loss(dtype)
                first_call(compiled, suffix)
                eager_y = seeded_target(eager.value_estimator, check_batch)
                compiled_y = seeded_target(compiled.value_estimator, check_batch)
                result[f"compiled_target_max_abs_diff{suffix}"] = float(
                    (compiled_y - eager_y).abs().max()
                )
                result[f"compiled_target_rel_diff{suffix}"] = relative_error(compiled_y, eager_y)
                if dtype == "bfloat16":  # both bf16 targets against the eager fp32 one
                    reference = preset_loss(
                        CBOPLoss, make_actor, size, dynamics, device, "float32"
                    ).value_estimator
                    fp32_y = seeded_target(reference, check_batch)
                    for name, y in (("eager", eager_y), ("compiled", compiled_y)):
                        result[f"{name}_target_bf16_rel_error"] = relative_error(y, fp32_y)
                steps[f"eager{suffix}"] = after_step(eager, buffer)
                steps[f"compiled{suffix}"] = after_step(compiled, buffer)
            torch._dynamo.reset()
            first_call(compiled_loss(dtypes[0]), "_warm")

            def rounds_of(step):
                return lambda: [step() for _ in range(steps_per_round)]

            cpu: dict[str, float] = {}
            seconds = time_interleaved(
                {k: rounds_of(v) for k, v in steps.items()}, rounds, device, cpu
            )
    finally:
        if previous_cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous_cache
    for suffix in (suffixes[dtype] for dtype in dtypes):
        eager_ms = 1e3 * cpu[f"eager{suffix}"] / steps_per_round
        compiled_ms = 1e3 * cpu[f"compiled{suffix}"] / steps_per_round
        result[f"cpu_preset_cpu_ms_per_step_eager{suffix}"] = eager_ms
        result[f"cpu_preset_cpu_ms_per_step_compiled{suffix}"] = compiled_ms
        result[f"cpu_preset_steps_per_s_eager{suffix}"] = (
            steps_per_round / seconds[f"eager{suffix}"]
        )
        result[f"cpu_preset_steps_per_s_compiled{suffix}"] = (
            steps_per_round / seconds[f"compiled{suffix}"]
        )
        saved_s = (eager_ms - compiled_ms) / 1e3
        cold = result[f"compile_cpu_s{suffix}"]
        result[f"compile_break_even_steps{suffix}"] = cold / saved_s if saved_s > 0 else None
        result[f"compile_pays_in_main_job{suffix}"] = bool(
            saved_s > 0 and cold / saved_s < main_job_steps
        )
    return result
