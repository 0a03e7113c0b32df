"""All timings of one size: reference and project targets, CBOP and SAC updates, matmul peak.

Interleaved in the same rounds, each with its nominal GFLOP/s and share of the
matmul peak measured in those rounds, and the bf16 (and, on CUDA, TF32) target's
relative error. On CUDA it also times the whole CBOP step (fused capturable Adam and
the target update included, :class:`~cbop_torchrl.trainers.update.GradientStep`)
eager (``step_eager``, ``step_bf16_eager``) and captured as one CUDA graph
(``step_captured``, ``step_bf16_captured``), and counts the operations one eager
step dispatches (``step_dispatched_ops``: what the host launches without a graph).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict

import torch
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode
from torchrl.objectives import SACLoss, SoftUpdate

from benchmarks.speed.measure import relative_error, time_interleaved
from benchmarks.speed.models import build_models
from benchmarks.speed.reference import ReferenceTarget
from benchmarks.speed.sizes import Size, env_sizes, flop_counts
from cbop_torchrl.accel import CapturedStep, CBOPLoss, CBOPValueEstimator
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.trainers.update import GradientStep


def gradient_step(loss_module, optimizer) -> Callable[[TensorDict], None]:
    def step(batch: TensorDict) -> None:
        losses = loss_module(batch.clone(False))
        total = sum(v for k, v in losses.items() if k.startswith("loss_"))
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()

    return step


class _OpCounter(TorchDispatchMode):
    """Counts the operations dispatched while active (views included)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


def dispatched_ops(call: Callable[[], object]) -> int:
    """Operations one call of ``call`` dispatches (after a warm-up call)."""
    call()
    with _OpCounter() as counter:
        call()
    return counter.count


class _CompiledRunCounter(_OpCounter):
    """An :class:`_OpCounter` under which torch.compile's code runs (else dynamo runs eagerly).

    Off while dynamo and inductor compile, on while the compiled code runs: it counts the
    operations that code still dispatches (extern kernels such as matmuls, eager random
    draws), not those fused into generated kernels.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


#: The profiler record of an inductor-generated CPU kernel (``cpp.enable_kernel_profile``).
_CPP_KERNEL = re.compile(r"(graph_\d+_)?cpp_")


def compiled_ops(call: Callable[[], object]) -> dict[str, int]:
    """Operations one call of ``call`` runs, each torch.compile kernel counted as one.

    ``dispatched``: the aten operations dispatched (the eager code's and those compiled code
    still calls); ``kernels``: the calls of kernels inductor generated, each one operation
    as each is one launch on CUDA, counted from the profiler records inductor writes into
    its CPU kernels with ``cpp.enable_kernel_profile``; ``total``: their sum. Resets dynamo
    and compiles ``call``'s regions anew in a warm-up call with that setting (a region
    compiled without it would run unseen).
    """
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        call()
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as profile:
            with _CompiledRunCounter() as counter:
                call()
    kernels = sum(1 for event in profile.events() if _CPP_KERNEL.match(event.name))
    return {"dispatched": counter.count, "kernels": kernels, "total": counter.count + kernels}


def whole_step(
    actor,
    qnets,
    dynamics,
    act_dim: int,
    size: Size,
    device: torch.device,
    rollout_dtype: str,
    compile: bool = False,
) -> GradientStep:
    """The CBOP stage's step: loss, backward, fused (capturable on CUDA) Adam, target update.

    ``compile``: the target compiled by inductor for a whole-step CUDA graph, as the CBOP
    stage runs it with ``compile=true`` and ``cuda_graph=true``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No target network updater")
        loss = CBOPLoss(
            actor, qnets, dynamics, action_spec=action_spec(act_dim, device),
            horizon=size.horizon, rollout_dtype=rollout_dtype, compile=compile,
        ).to(device)  # fmt: skip
    loss.value_estimator.whole_step_graph = compile and device.type == "cuda"
    optimizer = torch.optim.Adam(
        loss.parameters(), lr=3e-4, fused=True, capturable=device.type == "cuda"
    )
    return GradientStep(loss, optimizer, SoftUpdate(loss, tau=0.005))


def warm_capture(step: GradientStep, batch: TensorDict) -> CapturedStep:
    """``step`` captured as one CUDA graph, past its warm-up, its capture and one replay."""
    replay = CapturedStep(step)
    for _ in range(replay.warmup_steps + 2):
        replay(batch)
    return replay


class _Precision:
    """``torch.set_float32_matmul_precision(value)`` for the duration of a call."""

    def __init__(self, value: str) -> None:
        self.value, self.saved = value, "highest"

    def __enter__(self) -> None:
        self.saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.value)

    def __exit__(self, *exc: object) -> None:
        torch.set_float32_matmul_precision(self.saved)


def bench_size(
    size: Size,
    device: torch.device,
    rounds: int,
    matmul_n: int,
    compile_q: bool,
    compiled_step: bool = False,
) -> dict:
    """All timings of one size; the matmul peak is re-measured in the same interleaved rounds.

    ``compiled_step`` (CUDA): also the bf16 step with ``compile=true`` captured as one CUDA
    graph (``step_bf16_captured_compiled``), and the seconds its compilation took."""
    obs_dim, act_dim = env_sizes(size.family)
    actor, qnets, dynamics, batch = build_models(size, device)
    common = dict(gamma=0.99, horizon=size.horizon, psi=1.0, seed=0, compile=compile_q)
    est_fp32 = CBOPValueEstimator(
        actor_network=actor,
        qvalue_network=qnets,
        dynamics=dynamics,
        rollout_dtype="float32",
        **common,
    )
    est_bf16 = CBOPValueEstimator(
        actor_network=actor,
        qvalue_network=qnets,
        dynamics=dynamics,
        rollout_dtype="bfloat16",
        **common,
    )
    reference = ReferenceTarget(actor, qnets, dynamics, size.horizon, 0.99)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No target network updater")
        cbop_loss = CBOPLoss(
            actor,
            qnets,
            dynamics,
            action_spec=action_spec(act_dim, device),
            horizon=size.horizon,
            seed=0,
            compile=compile_q,
        ).to(device)
        sac_actor = make_actor(obs_dim, act_dim, size.hidden, device=device)
        sac_qnets = make_qvalue_ensemble(
            size.members, obs_dim, act_dim, size.q_hidden, device=device
        )
        sac_loss = SACLoss(
            sac_actor,
            sac_qnets,
            num_qvalue_nets=size.members,
            action_spec=action_spec(act_dim, device),
        ).to(device)
    cbop_step = gradient_step(cbop_loss, torch.optim.Adam(cbop_loss.parameters(), lr=3e-4))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No target network updater")
        cbop_loss_bf16 = CBOPLoss(
            actor,
            qnets,
            dynamics,
            action_spec=action_spec(act_dim, device),
            horizon=size.horizon,
            seed=0,
            compile=compile_q,
            rollout_dtype="bfloat16",
        ).to(device)
    cbop_step_bf16 = gradient_step(
        cbop_loss_bf16, torch.optim.Adam(cbop_loss_bf16.parameters(), lr=3e-4)
    )
    sac_step = gradient_step(sac_loss, torch.optim.Adam(sac_loss.parameters(), lr=3e-4))

    y32 = est_fp32.compute_target(batch)[0]
    y16 = est_bf16.compute_target(batch)[0]
    rel_error = relative_error(y16, y32)
    bootstrap = y32 - batch.get(("next", "reward"))  # gamma (V - alpha log pi), the model part
    rel_error_bootstrap = relative_error(y16, y32, scale=bootstrap)

    on_cuda = device.type == "cuda"
    tf32 = _Precision("high")
    if on_cuda:
        with tf32:
            rel_error_tf32 = relative_error(est_fp32.compute_target(batch)[0], y32)
        steps = {
            name: whole_step(actor, qnets, dynamics, act_dim, size, device, dtype)
            for name, dtype in (("fp32", "float32"), ("bf16", "bfloat16"))
        }
        captured = {name: warm_capture(step, batch) for name, step in steps.items()}
        step_ops = dispatched_ops(lambda: steps["bf16"](batch))
        compile_error = None
        if compiled_step:
            started = time.perf_counter()
            try:  # the eager and captured timings still count when inductor fails here
                step = whole_step(actor, qnets, dynamics, act_dim, size, device, "bfloat16", True)
                captured["bf16_compiled"] = warm_capture(step, batch)
                torch.cuda.synchronize(device)
            except Exception as error:  # noqa: BLE001
                compile_error = f"{type(error).__name__}: {error}"[:500]
                print(f"the compiled step failed at {size.name}: {compile_error}")
            compile_seconds = time.perf_counter() - started

    calls = {
        "reference_target": lambda: reference(batch),
        "target_fp32": lambda: est_fp32.compute_target(batch),
        "target_bf16": lambda: est_bf16.compute_target(batch),
        "update": lambda: cbop_step(batch),
        "update_bf16": lambda: cbop_step_bf16(batch),
        "sac_update": lambda: sac_step(batch),
    }
    if on_cuda:
        calls["target_tf32"] = lambda: _with(tf32, lambda: est_fp32.compute_target(batch))
        calls["step_eager"] = lambda: steps["fp32"](batch)
        calls["step_bf16_eager"] = lambda: steps["bf16"](batch)
        calls["step_captured"] = lambda: captured["fp32"](batch)
        calls["step_bf16_captured"] = lambda: captured["bf16"](batch)
        if "bf16_compiled" in captured:
            calls["step_bf16_captured_compiled"] = lambda: captured["bf16_compiled"](batch)
    square = {
        dtype: torch.randn(matmul_n, matmul_n, device=device).to(dtype)
        for dtype in (torch.float32, torch.bfloat16)
    }
    for dtype, name in ((torch.float32, "matmul_fp32"), (torch.bfloat16, "matmul_bf16")):
        calls[name] = lambda a=square[dtype]: torch.mm(a, a)
    seconds = time_interleaved(calls, rounds, device)
    matmul_flops = 2 * matmul_n**3
    peaks = {
        "fp32": matmul_flops / seconds.pop("matmul_fp32") / 1e9,
        "bf16": matmul_flops / seconds.pop("matmul_bf16") / 1e9,
    }
    flops = flop_counts(size, obs_dim, act_dim)
    flops_of = {
        "reference_target": flops["target"],
        "target_fp32": flops["target"],
        "target_bf16": flops["target"],
        "update": flops["update"],
        "update_bf16": flops["update"],
        "sac_update": flops["sac_update"],
        "target_tf32": flops["target"],
        "step_eager": flops["update"],
        "step_bf16_eager": flops["update"],
        "step_captured": flops["update"],
        "step_bf16_captured": flops["update"],
        "step_bf16_captured_compiled": flops["update"],
    }
    peak_of = {
        "target_bf16": peaks["bf16"],
        "step_bf16_eager": peaks["bf16"],
        "step_bf16_captured": peaks["bf16"],
        "step_bf16_captured_compiled": peaks["bf16"],
    }
    result: dict = {
        "size": asdict(size),
        "target_gflop": flops["target"] / 1e9,
        "target_bf16_rel_error": rel_error,
        "target_bf16_rel_error_bootstrap": rel_error_bootstrap,
        "target_std": float(y32.std()),
        "target_mean": float(y32.mean()),
        "peak_fp32_gflops": peaks["fp32"],
        "peak_bf16_gflops": peaks["bf16"],
    }
    for name, sec in seconds.items():
        gflops = flops_of[name] / sec / 1e9
        peak = peak_of.get(name, peaks["fp32"])
        result[f"{name}_ms"] = sec * 1e3
        result[f"{name}_gflops"] = gflops
        result[f"{name}_peak_share"] = gflops / peak
        # The share of the bf16 matmul peak (a GPU's headline figure) for every variant.
        result[f"{name}_bf16_peak_share"] = gflops / peaks["bf16"]
        result[f"{name}_speedup_vs_reference"] = seconds["reference_target"] / sec
    result["update_over_target_fp32"] = seconds["update"] / seconds["target_fp32"]
    if on_cuda:
        result["target_tf32_rel_error"] = rel_error_tf32
        result["step_dispatched_ops"] = step_ops
        result["step_bf16_captured_speedup"] = (
            seconds["step_bf16_eager"] / seconds["step_bf16_captured"]
        )
        result["step_captured_speedup"] = seconds["step_eager"] / seconds["step_captured"]
        if "bf16_compiled" in captured:
            result["step_bf16_captured_compiled_speedup"] = (
                seconds["step_bf16_eager"] / seconds["step_bf16_captured_compiled"]
            )
            result["step_compile_seconds"] = compile_seconds
        if compile_error:
            result["step_compile_error"] = compile_error
        result["captured_nonfinite_steps"] = sum(r.step.health.read()[0] for r in captured.values())
    else:
        result["update_dispatched_ops"] = dispatched_ops(lambda: cbop_step_bf16(batch))
    return result


def _with(context, call: Callable[[], object]) -> object:
    with context:
        return call()
