"""The CBOP stage's whole step at the CPU preset, now and at earlier commits loaded from git.

Sample, loss, guarded Adam step, target update, metrics: in gradient steps/s, CPU
milliseconds per step and host synchronisations per step.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types
import warnings
from collections.abc import Callable

import torch
from torchrl.objectives import SoftUpdate

from benchmarks.speed import REPO
from benchmarks.speed.host_syncs import HostSyncCounter
from benchmarks.speed.measure import time_interleaved
from benchmarks.speed.models import build_models, preset_dataset
from benchmarks.speed.sizes import Size, cpu_preset_size, env_sizes
from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.trainers.cbop_stage import GuardedOptimizationStepper
from cbop_torchrl.trainers.logging import MetricsHook, flatten_metrics

#: The implementation the speed goals are measured against, loaded from git for the "before"
#: figure: its estimator/loss (TorchRL's TanhNormal actor, per-call seed read back) and,
#: written out in :func:`before_step`, its step (unfused Adam, one finiteness read per loss
#: key, metrics copied to the host every step).
BEFORE_COMMIT = "9d3ad48"
_BEFORE_MODULES = (
    ("modules.actor_critic", "cbop_torchrl/modules/actor_critic.py"),
    ("objectives.estimator", "cbop_torchrl/objectives/estimator.py"),
    ("objectives.loss", "cbop_torchrl/objectives/loss.py"),
)


#: The loss and estimator before the update's work-removal pass (one Q pass for the critic
#: and EDAC, stacked-baddbmm Q-ensembles in the loss, one actor-parameter load per
#: rollout), timed with today's step: what that pass gains (``..._previous``).
PREVIOUS_COMMIT = "12f2a4a"


def load_before_modules(
    commit: str = BEFORE_COMMIT, modules: tuple[tuple[str, str], ...] = _BEFORE_MODULES
) -> dict[str, types.ModuleType] | None:
    """The ``commit`` versions of the update's ``modules``, or None without git."""
    loaded: dict[str, types.ModuleType] = {}
    prefix = f"cbop_{commit}"
    for short, path in modules:
        try:
            source = subprocess.run(
                ["git", "-C", str(REPO), "show", f"{commit}:{path}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        for other in loaded:  # the old loss imports the old estimator
            source = source.replace(f"cbop_torchrl.{other}", f"{prefix}.{other}")
        module = types.ModuleType(f"{prefix}.{short}")
        sys.modules[module.__name__] = module
        exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
        loaded[short] = module
    return loaded


def preset_loss(loss_cls, actor_fn, size: Size, dynamics, device, rollout_dtype: str, **kwargs):
    """A ``loss_cls`` at ``size`` over ``dynamics``, its actor from ``actor_fn`` (seed 1)."""
    obs_dim, act_dim = env_sizes(size.family)
    torch.manual_seed(1)
    actor = actor_fn(obs_dim, act_dim, size.hidden, device=device)
    qnets = make_qvalue_ensemble(size.members, obs_dim, act_dim, size.q_hidden, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No target network updater")
        return loss_cls(
            actor,
            qnets,
            dynamics,
            action_spec=action_spec(act_dim, device),
            horizon=size.horizon,
            rollout_dtype=rollout_dtype,
            **kwargs,
        ).to(device)


def _optimizer(loss, fused: bool) -> torch.optim.Optimizer:
    groups = [
        {"params": list(loss.actor_network_params.values(True, True))},
        {"params": list(loss.qvalue_network_params.values(True, True))},
        {"params": [loss.log_alpha]},
    ]
    return torch.optim.Adam(groups, lr=3e-4, fused=fused)


def after_step(loss, buffer, interval: int = 250) -> Callable[[], None]:
    """The CBOP stage's step now: sample, the trainer's guarded step, the metrics hook."""
    trainer = types.SimpleNamespace(
        compute_loss=loss, optimizer=_optimizer(loss, fused=True), collected_frames=0
    )
    stepper = GuardedOptimizationStepper(types.SimpleNamespace(describe_last=lambda: "none"))
    metrics = MetricsHook(None, interval)
    updater = SoftUpdate(loss, tau=0.005)

    def step() -> None:
        trainer.collected_frames += 1
        losses = stepper.step(trainer, buffer.sample())
        updater.step()
        metrics(trainer.collected_frames, losses)

    return step


def before_step(loss, buffer) -> Callable[[], None]:
    """The CBOP stage's step at ``BEFORE_COMMIT`` (its stepper and metrics hook, as they were)."""
    optimizer = _optimizer(loss, fused=False)
    updater = SoftUpdate(loss, tau=0.005)
    sums: dict[str, float] = {}

    def step() -> None:
        losses = loss(buffer.sample())
        total = sum(value for key, value in losses.items() if key.startswith("loss_"))
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, math.inf)
        checked = {key: value for key, value in losses.items(True, True) if value.numel() > 0}
        bad = [
            key
            for key, value in checked.items()
            if value.is_floating_point() and not torch.isfinite(value).all()
        ]
        if not torch.isfinite(grad_norm) or bad:
            raise RuntimeError(f"non-finite {bad}")
        optimizer.step()
        losses = losses.detach()
        losses.set("grad_norm", grad_norm.detach())
        updater.step()
        for name, value in flatten_metrics(losses).items():  # read back every step
            sums[name] = sums.get(name, 0.0) + value

    return step


def bench_preset_steps(device: torch.device, rounds: int, steps_per_round: int = 10) -> dict:
    """Gradient steps/s of the CBOP stage at the CPU preset's sizes, before vs now.

    Same dynamics model, same batches' distribution, interleaved rounds of
    ``steps_per_round`` steps; also the host syncs per step (outside log steps).
    """
    size = cpu_preset_size()
    _, _, dynamics, _ = build_models(size, device)
    buffer = make_replay_buffer(preset_dataset(size, device), size.batch, device=device, seed=0)
    steps = {
        "now_fp32": after_step(
            preset_loss(CBOPLoss, make_actor, size, dynamics, device, "float32"), buffer
        ),
        "now_bf16": after_step(
            preset_loss(CBOPLoss, make_actor, size, dynamics, device, "bfloat16"), buffer
        ),
    }
    before = load_before_modules()
    if before is not None:
        old_loss = preset_loss(
            before["objectives.loss"].CBOPLoss,
            before["modules.actor_critic"].make_actor,
            size, dynamics, device, "float32",
        )  # fmt: skip
        steps["before"] = before_step(old_loss, buffer)
    previous = load_before_modules(PREVIOUS_COMMIT, _BEFORE_MODULES[1:])
    if previous is not None:
        steps["previous"] = after_step(
            preset_loss(
                previous["objectives.loss"].CBOPLoss, make_actor, size, dynamics, device, "float32"
            ),
            buffer,
        )
    # The default, estimator.rollout_dtype=auto: the pipeline's own choice on a preset batch.
    auto_loss = preset_loss(CBOPLoss, make_actor, size, dynamics, device, "float32")
    choice = auto_loss.value_estimator.select_rollout_dtype(buffer.sample())
    default = "now_bf16" if choice["rollout_dtype"] == "bfloat16" else "now_fp32"
    syncs = {}
    for name, step in steps.items():
        step()
        with HostSyncCounter() as counter:
            step()
        syncs[name] = counter.count

    def rounds_of(step):
        return lambda: [step() for _ in range(steps_per_round)]

    cpu: dict[str, float] = {}
    seconds = time_interleaved({k: rounds_of(v) for k, v in steps.items()}, rounds, device, cpu)
    result = {
        # The default (rollout_dtype=auto, its choice here) and both dtypes.
        "cpu_preset_rollout_dtype": choice["rollout_dtype"],
        "cpu_preset_rollout_choice": choice,
        "cpu_preset_steps_per_s": steps_per_round / seconds[default],
        "cpu_preset_steps_per_s_fp32": steps_per_round / seconds["now_fp32"],
        "cpu_preset_steps_per_s_bf16": steps_per_round / seconds["now_bf16"],
        # CPU time per step (all threads): with --threads 1, the wall time of an idle core.
        "cpu_preset_cpu_ms_per_step": 1e3 * cpu[default] / steps_per_round,
        "cpu_preset_cpu_ms_per_step_fp32": 1e3 * cpu["now_fp32"] / steps_per_round,
        "cpu_preset_cpu_ms_per_step_bf16": 1e3 * cpu["now_bf16"] / steps_per_round,
        "host_syncs_per_step": syncs[default],
        "host_syncs_per_step_fp32": syncs["now_fp32"],
        "host_syncs_per_step_bf16": syncs["now_bf16"],
        "cpu_preset_before_commit": BEFORE_COMMIT if before is not None else None,
    }
    if before is not None:
        result["cpu_preset_steps_per_s_before"] = steps_per_round / seconds["before"]
        result["cpu_preset_cpu_ms_per_step_before"] = 1e3 * cpu["before"] / steps_per_round
        result["host_syncs_per_step_before"] = syncs["before"]
    if previous is not None:
        result["cpu_preset_previous_commit"] = PREVIOUS_COMMIT
        result["cpu_preset_steps_per_s_previous"] = steps_per_round / seconds["previous"]
        result["cpu_preset_cpu_ms_per_step_previous"] = 1e3 * cpu["previous"] / steps_per_round
    return result
