"""All timings of one size: reference and project targets, CBOP and SAC updates, matmul peak.

Interleaved in the same rounds, each with its nominal GFLOP/s and share of the
matmul peak measured in those rounds, and the bf16 target's relative error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict

import torch
from tensordict import TensorDict
from torchrl.objectives import SACLoss

from benchmarks.speed.measure import relative_error, time_interleaved
from benchmarks.speed.models import build_models
from benchmarks.speed.reference import ReferenceTarget
from benchmarks.speed.sizes import Size, env_sizes, flop_counts
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.estimator import CBOPValueEstimator
from cbop_torchrl.objectives.loss import CBOPLoss


def gradient_step(loss_module, optimizer) -> Callable[[TensorDict], None]:
    def step(batch: TensorDict) -> None:
        losses = loss_module(batch.clone(False))
        total = sum(v for k, v in losses.items() if k.startswith("loss_"))
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()

    return step


def bench_size(
    size: Size, device: torch.device, rounds: int, matmul_n: int, compile_q: bool
) -> dict:
    """All timings of one size; the matmul peak is re-measured in the same interleaved rounds."""
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

    calls = {
        "reference_target": lambda: reference(batch),
        "target_fp32": lambda: est_fp32.compute_target(batch),
        "target_bf16": lambda: est_bf16.compute_target(batch),
        "update": lambda: cbop_step(batch),
        "update_bf16": lambda: cbop_step_bf16(batch),
        "sac_update": lambda: sac_step(batch),
    }
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
    }
    peak_of = {"target_bf16": peaks["bf16"]}
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
    return result
