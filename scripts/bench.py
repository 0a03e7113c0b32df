"""Benchmark of the CBOP update against the machine's matmul peak (issue 7, DESIGN.md section 5).

    python scripts/bench.py                      # paper and CPU-preset sizes, ~5-10 min on 2 cores
    python scripts/bench.py --quick              # CPU-preset sizes only, < 2 min
    python scripts/bench.py --json benchmarks/bench_cpu.json --device cuda

Everything is measured in ONE process, variants interleaved round by round so
that a busy machine slows them alike: ratios are what to compare.

For each size it times (ms per call, median over rounds):

- ``reference_target``: the official code's design, written here: fp32, one
  batched matmul per ensemble layer, particles materialized with ``repeat``,
  the Q-ensemble evaluated on every particle at every horizon, ``var_mean``
  over the ``M x K`` samples;
- ``target_fp32`` / ``target_bf16``: the project's :class:`CBOPValueEstimator`
  (``rollout_dtype`` float32 / bfloat16), and ``target_bf16_rel_error``
  ``mean|y_bf16 - y_fp32| / std(y_fp32)`` on the same batch and seed;
- ``matmul_fp32``/``matmul_bf16``: a large square matmul in the same rounds, the
  peak each size's "% peak" is taken against (the start-of-run figure is
  printed too; on a busy machine the two differ);
- ``update``: a full :class:`CBOPLoss` gradient step (fp32 target, critic with
  EDAC term, actor, alpha, Adam), and ``sac_update``: a stock TorchRL
  ``SACLoss`` step with the same M, the floor without model rollouts.

With the CPU-preset size it also times the CBOP stage's whole step (sample, loss,
guarded Adam step, target update, metrics) now, with bf16 rollouts, at
``BEFORE_COMMIT`` and with the loss/estimator of ``PREVIOUS_COMMIT``, in
gradient steps/s and in CPU milliseconds per step (``cpu_preset_*``), and the
host synchronisations per step. ``--compile-cpu`` adds the step with
``compile=True`` (inductor) against the eager one and the compile time
(:func:`bench_compiled_target`). The JSON records the host's CPU model and its
AMX/avx512_bf16 flags (:func:`host_cpu_info`) and a ``goals`` block: each speed
goal the run measured, met or missed by what factor and why (:func:`speed_goals`).

FLOPs are the design's nominal count ``(H+1) K B (M f_Q + f_pi) + H K B f_f``
(``f`` = 2 x multiply-adds of one row through a network), the same for every
target variant, so GFLOP/s compare the time to do the same useful work. The
update's count adds the critic/EDAC/actor passes (about 11 B M f_Q + 3 B f_pi).

Models have random weights; the dynamics' normalization is set so that rollouts
stay in walker2d's healthy range (few terminations). Timings do not depend on
the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

if __name__ == "__main__":  # before torch starts its thread pool; not when imported by tests
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the entry scripts (see cbop.py)
    os.environ.setdefault("RL_WARNINGS", "False")  # the losses here have no target updater

import torch  # noqa: E402
import yaml  # noqa: E402
from tensordict import TensorDict, TensorDictBase  # noqa: E402
from torchrl.objectives import SACLoss, SoftUpdate  # noqa: E402

from cbop_torchrl.data import make_replay_buffer  # noqa: E402
from cbop_torchrl.envs import read_env_specs  # noqa: E402
from cbop_torchrl.modules.actor_critic import (  # noqa: E402
    action_spec,
    make_actor,
    make_qvalue_ensemble,
)
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble  # noqa: E402
from cbop_torchrl.objectives.estimator import CBOPValueEstimator  # noqa: E402
from cbop_torchrl.objectives.loss import CBOPLoss  # noqa: E402
from cbop_torchrl.registry import get_family  # noqa: E402
from cbop_torchrl.trainers.hooks import GuardedOptimizationStepper  # noqa: E402
from cbop_torchrl.trainers.logging import MetricsHook, flatten_metrics  # noqa: E402
from cbop_torchrl.utils import (  # noqa: E402
    HostSyncCounter,
    atomic_json_dump,
    unwritable_reason,
)

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Size:
    """One benchmark configuration (DESIGN.md section 5 symbols)."""

    name: str
    batch: int  # B
    particles: int  # K (= dynamics elites)
    members: int  # M (Q-ensemble)
    horizon: int  # H
    hidden: tuple[int, ...]  # actor/critic hidden widths
    dyn_hidden: tuple[int, ...]  # dynamics hidden widths
    dyn_members: int  # dynamics ensemble size (>= K)
    family: str = "walker2d"


PAPER = Size("paper", 256, 20, 20, 10, (256, 256, 256), (200,) * 4, 30)
TINY = Size("tiny", 8, 2, 2, 2, (16, 16), (16, 16), 3)


def cpu_preset_size() -> Size:
    """The sizes of ``configs/preset/cpu.yaml`` (missing keys: ``configs/config.yaml``)."""
    configs = REPO / "cbop_torchrl" / "configs"
    base = yaml.safe_load((configs / "config.yaml").read_text())
    preset = yaml.safe_load((configs / "preset/cpu.yaml").read_text())
    dyn = yaml.safe_load((configs / "dynamics/default.yaml").read_text())

    def get(section: str, key: str, default=None):
        for source in (preset, base):
            value = (source.get(section) or {}).get(key)
            if value is not None:
                return value
        return default

    dyn_hidden = (int(dyn["hidden_size"]),) * int(dyn["num_layers"])
    return Size(
        "cpu",
        batch=int(get("train", "batch_size", 256)),
        particles=int(get("dynamics", "num_elites", dyn["num_elites"])),
        members=int(get("agent", "num_qvalue_nets", 20)),
        horizon=int(get("estimator", "horizon", 10)),
        hidden=tuple(int(h) for h in get("agent", "hidden_sizes")),
        dyn_hidden=dyn_hidden,
        dyn_members=int(get("dynamics", "num_members", dyn["num_members"])),
    )


# --------------------------------------------------------------------------- host
#: CPU flags that decide the bf16 figures: AMX tiles run bf16 matmuls at several times the
#: fp32 rate; avx512_bf16 alone at about twice; without either bf16 is emulated.
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")


def host_cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """``cpu_model`` and ``cpu_has_<flag>`` for :data:`CPU_FLAGS`, from ``cpuinfo`` (Linux).

    Keys are absent where the file is missing or has no such line (other systems),
    so figures from different hosts can be told apart without guessing.
    ``torch_cpu_capability`` is the instruction set torch's CPU kernels dispatch to.
    """
    info: dict = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        text = cpuinfo.read_text()
    except OSError:
        return info
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor's lines
            fields[key.strip()] = value.strip()
    if "model name" in fields:
        info["cpu_model"] = fields["model name"]
    if "flags" in fields:
        flags = set(fields["flags"].split())
        info.update({f"cpu_has_{flag}": flag in flags for flag in CPU_FLAGS})
    return info


def relative_error(
    y: torch.Tensor, reference: torch.Tensor, scale: torch.Tensor | None = None
) -> float:
    """``mean|y - reference| / std(scale)``; ``scale`` defaults to ``reference``."""
    scale = reference if scale is None else scale
    return float((y - reference).abs().mean() / scale.std().clamp_min(1e-12))


def seeded_target(estimator, batch: TensorDictBase, seed: int = 0) -> torch.Tensor:
    """``estimator``'s target ``y`` for ``batch`` after ``torch.manual_seed(seed)``; RNG kept."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return estimator.compute_target(batch)[0]


# --------------------------------------------------------------------------- timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    device: torch.device,
    cpu_seconds: dict[str, float] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each callable; one warm-up, then ``rounds`` interleaved rounds.

    With ``cpu_seconds`` given, it also receives each call's median CPU time of
    this process (all its threads): on a shared machine, where other jobs take
    the cores, that moves much less than the wall-clock time.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    cpu_samples: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm-up (allocator, autotuning, compilation)
        fn()
    sync(device)
    for _ in range(rounds):
        for name, fn in calls.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - start)
            cpu_samples[name].append(time.process_time() - cpu_start)
    if cpu_seconds is not None:
        cpu_seconds.update({name: statistics.median(v) for name, v in cpu_samples.items()})
    return {name: statistics.median(values) for name, values in samples.items()}


def matmul_peak(dtype: torch.dtype, n: int, device: torch.device, rounds: int) -> float:
    """Best GFLOP/s of an ``n x n`` matmul in ``dtype``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    best = math.inf
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


# --------------------------------------------------------------------------- FLOPs
def mlp_flops(sizes: list[int]) -> int:
    """FLOPs of one row through an MLP with layer widths ``sizes`` (2 x multiply-adds)."""
    return 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=False))


def flop_counts(size: Size, obs_dim: int, act_dim: int) -> dict[str, int]:
    f_q = mlp_flops([obs_dim + act_dim, *size.hidden, 1])
    f_pi = mlp_flops([obs_dim, *size.hidden, 2 * act_dim])
    f_dyn = mlp_flops([obs_dim + act_dim, *size.dyn_hidden, 2 * (obs_dim + 1)])
    B, K, M, H = size.batch, size.particles, size.members, size.horizon
    target = (H + 1) * K * B * (M * f_q + f_pi) + H * K * B * f_dyn
    update = target + 11 * B * M * f_q + 3 * B * f_pi
    sac = 11 * B * M * f_q + 6 * B * f_pi  # SAC's own bootstrap + the same passes, no EDAC term
    return {"target": target, "update": update, "sac_update": sac}


# --------------------------------------------------------------------------- models
def env_sizes(family: str) -> tuple[int, int]:
    """Observation and action sizes of a known family's environment (from its TorchRL specs)."""
    specs = read_env_specs(get_family(family))
    return specs.observation_shape[-1], specs.action_shape[-1]


def build_models(size: Size, device: torch.device, seed: int = 0):
    """Actor, M Q-networks, a dynamics model (K elites) and a batch of transitions."""
    torch.manual_seed(seed)
    family = get_family(size.family)
    obs_dim, act_dim = env_sizes(size.family)
    actor = make_actor(obs_dim, act_dim, size.hidden, device=device)
    qnets = make_qvalue_ensemble(size.members, obs_dim, act_dim, size.hidden, device=device)
    ensemble = GaussianEnsemble(obs_dim, act_dim, size.dyn_members, size.dyn_hidden).to(device)
    # Normalization: states around walker2d's standing pose, small state deltas,
    # rewards ~ N(1, 1): rollouts stay healthy with a random network.
    pose = torch.zeros(obs_dim, device=device)
    pose[0] = 1.25
    inputs = torch.cat(
        [
            pose + 0.1 * torch.randn(4096, obs_dim, device=device),
            torch.rand(4096, act_dim, device=device) * 2 - 1,
        ],
        dim=-1,
    )
    targets = torch.cat(
        [
            0.02 * torch.randn(4096, obs_dim, device=device),
            1.0 + torch.randn(4096, 1, device=device),
        ],
        dim=-1,
    )
    ensemble.set_normalizer(inputs, targets)
    dynamics = DynamicsModel(ensemble, family.termination, elites=range(size.particles)).to(device)
    with torch.no_grad():  # Q values of a realistic scale (~100 +- 10), which bf16 must resolve
        for qnet in qnets:
            out_layer = [m for m in qnet.module if isinstance(m, torch.nn.Linear)][-1]
            out_layer.weight.mul_(50.0)
            out_layer.bias.fill_(100.0)
    obs = pose + 0.1 * torch.randn(size.batch, obs_dim, device=device)
    batch = TensorDict(
        {
            "observation": obs,
            "action": torch.rand(size.batch, act_dim, device=device) * 2 - 1,
            ("next", "observation"): obs + 0.02 * torch.randn(size.batch, obs_dim, device=device),
            ("next", "reward"): 1.0 + torch.randn(size.batch, 1, device=device),
            ("next", "terminated"): torch.zeros(size.batch, 1, dtype=torch.bool, device=device),
            ("next", "truncated"): torch.zeros(size.batch, 1, dtype=torch.bool, device=device),
            ("next", "done"): torch.zeros(size.batch, 1, dtype=torch.bool, device=device),
        },
        batch_size=[size.batch],
    )
    return actor, qnets, dynamics, batch


# ------------------------------------------------------------------ reference design
def _stacked_linear(qnets) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(W [M, in, out], b [M, 1, out]), ...]`` of the Q-networks' Linear layers."""
    layers = [m for m in qnets[0].module if isinstance(m, torch.nn.Linear)]
    stacked = []
    for i in range(len(layers)):
        linears = [[m for m in q.module if isinstance(m, torch.nn.Linear)][i] for q in qnets]
        weight = torch.stack([lin.weight.detach().t() for lin in linears]).contiguous()
        bias = torch.stack([lin.bias.detach() for lin in linears]).unsqueeze(1)
        stacked.append((weight, bias))
    return stacked


class ReferenceTarget:
    """The official code's target design (fp32, ``repeat``ed particles, ``var_mean``).

    Written for comparison only: per horizon ``t = 0..H`` the Q-ensemble runs on
    all ``K N`` particle rows (``bmm`` + bias + ReLU per layer on a member-expanded
    input), the dynamics elites are gathered from the full ensemble at every step,
    the returns are accumulated into ``[K, N, H+1]``/``[M, K, N, H+1]`` buffers and
    the per-horizon moments come from ``var_mean`` over ``(M, K)``; LCB of the
    inverse-variance-weighted posterior.
    """

    def __init__(
        self, actor, qnets, dynamics: DynamicsModel, horizon: int, gamma: float, psi: float = 1.0
    ) -> None:
        self.actor, self.dynamics = actor, dynamics
        self.q_layers = _stacked_linear(qnets)
        self.horizon, self.gamma, self.psi = horizon, gamma, psi

    def q_ensemble(self, x: torch.Tensor) -> torch.Tensor:  # [R, in] -> [M, R, 1]
        M = self.q_layers[0][0].shape[0]
        h = x.unsqueeze(0).expand(M, *x.shape)
        for i, (w, b) in enumerate(self.q_layers):
            h = torch.bmm(h, w) + b
            if i < len(self.q_layers) - 1:
                h = torch.relu(h)
        return h

    def dynamics_step(self, obs: torch.Tensor, action: torch.Tensor, K: int):
        ens = self.dynamics.ensemble
        members = self.dynamics.elite_indices
        x = ((torch.cat([obs, action], -1) - ens.input_mean) / ens.input_std).view(
            K, -1, obs.shape[-1] + action.shape[-1]
        )
        n_layers = len(ens.net.layers)
        for i, layer in enumerate(ens.net.layers):
            w, b = layer.weight.index_select(0, members), layer.bias.index_select(0, members)
            x = torch.bmm(x, w) + b
            if i < n_layers - 1:
                x = torch.nn.functional.silu(x)
        mean, raw_logvar = x.chunk(2, dim=-1)
        max_lv, min_lv = ens.max_logvar[members], ens.min_logvar[members]
        logvar = max_lv - torch.nn.functional.softplus(max_lv - raw_logvar)
        logvar = min_lv + torch.nn.functional.softplus(logvar - min_lv)
        sample = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        sample = (sample * ens.target_std + ens.target_mean).reshape(-1, sample.shape[-1])
        obs_dim = obs.shape[-1]
        next_obs = obs + sample[:, :obs_dim]
        return next_obs, sample[:, obs_dim:], self.dynamics.termination_fn(next_obs).unsqueeze(-1)

    def sample(self, obs: torch.Tensor):
        dist = self.actor.get_dist(TensorDict({"observation": obs}, batch_size=obs.shape[:1]))
        action = dist.sample()
        return action, dist

    @torch.no_grad()
    def __call__(self, batch: TensorDict) -> torch.Tensor:
        K, H, gamma = self.dynamics.num_elites, self.horizon, self.gamma
        next_obs = batch.get(("next", "observation"))
        N = next_obs.shape[0]
        M = self.q_layers[0][0].shape[0]
        first_action, dist = self.sample(next_obs)
        log_prob = dist.log_prob(first_action)
        obs = next_obs.repeat(K, 1)  # [KN, O]
        action = first_action.repeat(K, 1)
        terminated = torch.zeros(K * N, 1, dtype=torch.bool, device=obs.device)
        terminated_step = torch.zeros(N, H + 1, dtype=torch.bool, device=obs.device)
        x_returns = torch.zeros(K, N, H + 1, device=obs.device)
        q_terms = torch.zeros(M, K, N, H + 1, device=obs.device)
        for t in range(H + 1):
            if t > 0:
                action, _ = self.sample(obs)
            q = self.q_ensemble(torch.cat([obs, action], -1))  # [M, KN, 1]
            q[terminated.unsqueeze(0).expand(M, -1, -1)] = 0
            q_terms[..., t] = q.view(M, K, N) * gamma**t
            if t < H:
                obs, reward, done = self.dynamics_step(obs, action, K)
                reward[terminated] = 0
                terminated |= done
                terminated_step[:, t + 1 :] = terminated.view(K, N, 1).any(0)
                x_returns[..., t + 1 :] += reward.view(K, N, 1) * gamma**t
        returns = x_returns.unsqueeze(0) + q_terms  # [M, K, N, H+1]
        var, mean = torch.var_mean(returns, dim=(0, 1))  # [N, H+1]
        precision = 1.0 / var.clamp_min(1e-5)
        precision[terminated_step] = 0
        weights = precision / precision.sum(-1, keepdim=True)
        post_mean = (weights * mean).sum(-1)
        post_std = (1.0 / precision.sum(-1)).sqrt()
        value = post_mean - self.psi * post_std
        reward0 = batch.get(("next", "reward")).squeeze(-1)
        not_done = 1.0 - batch.get(("next", "terminated")).squeeze(-1).float()
        return reward0 + gamma * not_done * (value - 0.0 * log_prob)


# --------------------------------------------------------------------------- benches
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
        sac_qnets = make_qvalue_ensemble(size.members, obs_dim, act_dim, size.hidden, device=device)
        sac_loss = SACLoss(
            sac_actor,
            sac_qnets,
            num_qvalue_nets=size.members,
            action_spec=action_spec(act_dim, device),
        ).to(device)
    cbop_step = gradient_step(cbop_loss, torch.optim.Adam(cbop_loss.parameters(), lr=3e-4))
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
        result[f"{name}_speedup_vs_reference"] = seconds["reference_target"] / sec
    result["update_over_target_fp32"] = seconds["update"] / seconds["target_fp32"]
    return result


# ------------------------------------------------------------- the CBOP stage's step
#: The implementation before issue 19, loaded from git for the "before" figure: its
#: estimator/loss (TorchRL's TanhNormal actor, per-call seed read back) and, written out
#: in :func:`before_step`, its step (unfused Adam, one finiteness read per loss key,
#: metrics copied to the host every step).
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


def preset_dataset(size: Size, device: torch.device, n: int = 8192) -> TensorDict:
    """``n`` walker2d-shaped transitions around the standing pose (see :func:`build_models`)."""
    obs_dim, act_dim = env_sizes(size.family)
    pose = torch.zeros(obs_dim, device=device)
    pose[0] = 1.25
    obs = pose + 0.1 * torch.randn(n, obs_dim, device=device)
    return TensorDict(
        {
            "observation": obs,
            "action": torch.rand(n, act_dim, device=device) * 2 - 1,
            ("next", "observation"): obs + 0.02 * torch.randn(n, obs_dim, device=device),
            ("next", "reward"): 1.0 + torch.randn(n, 1, device=device),
            ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool, device=device),
        },
        batch_size=[n],
    )


def _preset_loss(loss_cls, actor_fn, size: Size, dynamics, device, rollout_dtype: str, **kwargs):
    obs_dim, act_dim = env_sizes(size.family)
    torch.manual_seed(1)
    actor = actor_fn(obs_dim, act_dim, size.hidden, device=device)
    qnets = make_qvalue_ensemble(size.members, obs_dim, act_dim, size.hidden, device=device)
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
            _preset_loss(CBOPLoss, make_actor, size, dynamics, device, "float32"), buffer
        ),
        "now_bf16": after_step(
            _preset_loss(CBOPLoss, make_actor, size, dynamics, device, "bfloat16"), buffer
        ),
    }
    before = load_before_modules()
    if before is not None:
        old_loss = _preset_loss(
            before["objectives.loss"].CBOPLoss,
            before["modules.actor_critic"].make_actor,
            size, dynamics, device, "float32",
        )  # fmt: skip
        steps["before"] = before_step(old_loss, buffer)
    previous = load_before_modules(PREVIOUS_COMMIT, _BEFORE_MODULES[1:])
    if previous is not None:
        steps["previous"] = after_step(
            _preset_loss(
                previous["objectives.loss"].CBOPLoss, make_actor, size, dynamics, device, "float32"
            ),
            buffer,
        )
    # The default, estimator.rollout_dtype=auto: the pipeline's own choice on a preset batch.
    auto_loss = _preset_loss(CBOPLoss, make_actor, size, dynamics, device, "float32")
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

    ``compile=True`` compiles the estimator's tensor part of the target
    (:meth:`CBOPValueEstimator._target_tensors`: actor, dynamics and Q-ensemble rollout,
    returns, posterior; one graph, no breaks). Times the CBOP stage's whole step with it
    against the eager step in the same process, for each rollout dtype in ``dtypes``, and
    checks the targets on one batch with the same seed (random draws are eager ones; in
    bf16 also each against the eager fp32 target, ``*_target_bf16_rel_error``). The
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
        return _preset_loss(CBOPLoss, make_actor, size, dynamics, device, dtype, compile=True)

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
                eager = _preset_loss(CBOPLoss, make_actor, size, dynamics, device, dtype)
                compiled = compiled_loss(dtype)
                first_call(compiled, suffix)
                eager_y = seeded_target(eager.value_estimator, check_batch)
                compiled_y = seeded_target(compiled.value_estimator, check_batch)
                result[f"compiled_target_max_abs_diff{suffix}"] = float(
                    (compiled_y - eager_y).abs().max()
                )
                result[f"compiled_target_rel_diff{suffix}"] = relative_error(compiled_y, eager_y)
                if dtype == "bfloat16":  # both bf16 targets against the eager fp32 one
                    reference = _preset_loss(
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


def bench_dynamics_training(device: torch.device, size: Size, steps: int) -> dict:
    """Minibatch steps of the project's training epoch on synthetic standardized data."""
    # The trainer's inner loop (private helper): the same forward/NLL/backward/Adam step.
    from cbop_torchrl.trainers.dynamics import DynamicsConfig, _train_epoch

    obs_dim, act_dim = env_sizes(size.family)
    config = DynamicsConfig(
        num_members=size.dyn_members,
        num_elites=size.particles,
        hidden_size=size.dyn_hidden[0],
        num_layers=len(size.dyn_hidden),
        weight_decay=(1e-4,) * (len(size.dyn_hidden) + 1),
    )
    ensemble = GaussianEnsemble(obs_dim, act_dim, size.dyn_members, size.dyn_hidden).to(device)
    optimizer = torch.optim.Adam(ensemble.param_groups(config.weight_decay), lr=config.lr)
    rows = steps * config.batch_size
    x = torch.randn(rows, obs_dim + act_dim, device=device)
    y = torch.randn(rows, obs_dim + 1, device=device)
    bootstrap = torch.randint(rows, (size.dyn_members, rows), device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    _train_epoch(
        ensemble,
        optimizer,
        x[: config.batch_size],
        y[: config.batch_size],
        bootstrap[:, : config.batch_size] % config.batch_size,
        gen,
        config,
    )  # warm-up
    sync(device)
    start = time.perf_counter()
    _train_epoch(ensemble, optimizer, x, y, bootstrap, gen, config)
    sync(device)
    seconds = time.perf_counter() - start
    samples = rows * size.dyn_members  # (row, member) pairs
    flops = 3 * samples * mlp_flops([obs_dim + act_dim, *size.dyn_hidden, 2 * (obs_dim + 1)])
    return {
        "dynamics_train_samples_per_s": samples / seconds,
        "dynamics_train_gflops": flops / seconds / 1e9,
        "dynamics_train_ms_per_step": seconds / steps * 1e3,
    }


def bench_evaluation(num_envs: int, max_steps: int, hidden: tuple[int, ...]) -> dict:
    """Env steps/s of the vectorized evaluator vs one environment at a time."""
    from cbop_torchrl.envs import evaluate_policy, make_eval_env

    family = get_family("hopper")
    actor = make_actor(*env_sizes("hopper"), hidden)
    env = make_eval_env(family, num_envs)
    start = time.perf_counter()
    result = evaluate_policy(actor, family, env, max_steps=max_steps)
    vec_seconds = time.perf_counter() - start
    vec_steps = sum(result.lengths)
    env.close()
    single = make_eval_env(family, 1)
    single_steps, start = 0, time.perf_counter()
    for episode in range(num_envs):
        single_steps += sum(evaluate_policy(actor, family, single, max_steps, seed=episode).lengths)
    single_seconds = time.perf_counter() - start
    single.close()
    return {
        "eval_vectorized_steps_per_s": vec_steps / vec_seconds,
        "eval_single_env_steps_per_s": single_steps / single_seconds,
        "eval_num_envs": num_envs,
    }


# --------------------------------------------------------------------------- report
def print_size(result: dict) -> None:
    size = result["size"]
    print(
        f"\n== {size['name']}: B {size['batch']} K {size['particles']} M {size['members']} "
        f"H {size['horizon']} hidden {size['hidden']} dynamics {size['dyn_hidden']} "
        f"(target {result['target_gflop']:.1f} GFLOP)"
    )
    print(
        f"matmul peak in the same rounds: {result['peak_fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{result['peak_bf16_gflops']:.0f} bf16 (% peak: target_bf16 against bf16, others fp32)"
    )
    print(f"{'':18}{'ms/call':>10}{'GFLOP/s':>10}{'% peak':>8}{'vs ref':>8}")
    for name in ("reference_target", "target_fp32", "target_bf16", "update", "sac_update"):
        print(
            f"{name:18}{result[name + '_ms']:10.1f}{result[name + '_gflops']:10.1f}"
            f"{100 * result[name + '_peak_share']:8.1f}"
            f"{result[name + '_speedup_vs_reference']:7.2f}x"
        )
    print(
        f"bf16 target: mean|dy|/std(y) = {100 * result['target_bf16_rel_error']:.3f}% "
        f"(of the bootstrap's std: {100 * result['target_bf16_rel_error_bootstrap']:.3f}%; "
        f"y = {result['target_mean']:.1f} +- {result['target_std']:.1f}); "
        f"update / fp32 target = {result['update_over_target_fp32']:.2f}"
    )


#: Issue 19's goals for the figures of this script (``large_dataset.py`` has the large-data ones).
SPEED_GOALS = {
    "cpu_preset_steps_per_s": 20.0,  # CBOP stage at the CPU preset, 2 cores
    "host_syncs_per_step": 1,  # outside logging intervals
    "paper_target_bf16_peak_share": 0.5,  # of the bf16 matmul peak in the same rounds
}


def speed_goals(report: dict) -> dict[str, dict]:
    """Each goal this run measured: its value, whether it is met and, if not, by how much.

    ``miss`` is how far off the value is as a factor (goal / value for a floor, value / goal
    for a ceiling); ``why`` names the measured figures that explain a miss, so the JSON
    says on its own what it would take.
    """
    goals: dict[str, dict] = {}
    steps = report.get("cpu_preset_steps_per_s")
    if steps is not None:
        goal = SPEED_GOALS["cpu_preset_steps_per_s"]
        # Every path measured here, by CPU ms per step (compiled ones: --compile-cpu).
        cpu_ms = {
            f"default ({report.get('cpu_preset_rollout_dtype', 'float32')} rollouts)": report[
                "cpu_preset_cpu_ms_per_step"
            ],
            "fp32 rollouts": report.get("cpu_preset_cpu_ms_per_step_fp32"),
            "bf16 rollouts": report.get("cpu_preset_cpu_ms_per_step_bf16"),
            "compiled fp32": report.get("cpu_preset_cpu_ms_per_step_compiled"),
            "compiled bf16": report.get("cpu_preset_cpu_ms_per_step_compiled_bf16"),
        }
        cpu_ms = {k: v for k, v in cpu_ms.items() if v is not None}
        wall_ms = 1e3 / steps
        goals["cpu_preset_steps_per_s"] = {
            "goal": goal,
            "value": steps,
            "met": steps >= goal,
            "miss": goal / steps,
            "why": (
                f"the default step takes {wall_ms:.0f} ms of wall time and "
                f"{report['cpu_preset_cpu_ms_per_step']:.0f} ms of CPU time "
                f"({report['cpu_preset_cpu_ms_per_step'] / wall_ms:.2f} of {report['threads']} "
                f"threads busy on average); {goal:.0f} steps/s needs {1e3 / goal:.0f} ms of wall "
                "time. CPU ms per step: "
                + ", ".join(f"{k} {v:.0f}" for k, v in cpu_ms.items())
                + f"; matmul peak {report['peak_fp32_gflops']:.0f} GFLOP/s fp32, "
                f"{report['peak_bf16_gflops']:.0f} bf16"
            ),
        }
    syncs = report.get("host_syncs_per_step")
    if syncs is not None:
        goal = SPEED_GOALS["host_syncs_per_step"]
        goals["host_syncs_per_step"] = {
            "goal": goal,
            "value": syncs,
            "met": syncs <= goal,
            "miss": syncs / goal,
            "why": f"{syncs} host syncs counted in one step outside a logging interval",
        }
    paper = report.get("sizes", {}).get("paper")
    if paper is not None:
        goal = SPEED_GOALS["paper_target_bf16_peak_share"]
        share = paper["target_bf16_peak_share"]
        goals["paper_target_bf16_peak_share"] = {
            "goal": goal,
            "value": share,
            "met": share >= goal,
            "miss": goal / share,
            "why": (
                f"the bf16 target runs {paper['target_bf16_gflops']:.0f} GFLOP/s against a bf16 "
                f"matmul peak of {paper['peak_bf16_gflops']:.0f} in the same rounds (fp32 peak "
                f"{paper['peak_fp32_gflops']:.0f}: bf16 is "
                f"{paper['peak_bf16_gflops'] / paper['peak_fp32_gflops']:.1f}x fp32 here)"
            ),
        }
    for name, goal in report.get("large_dataset_goals", {}).items():
        value = report[f"large_dataset_{name}"]
        floor = name == "samples_per_s"
        goals[f"large_dataset_{name}"] = {
            "goal": goal["goal"],
            "value": value,
            "met": goal["met"],
            "miss": goal["goal"] / value if floor else value / goal["goal"],
        }
    return goals


def print_goals(goals: dict[str, dict]) -> None:
    print("\ngoals (issue 19):")
    for name, goal in goals.items():
        verdict = "met" if goal["met"] else f"missed by {goal['miss']:.2f}x"
        print(f"  {name}: {goal['value']:.4g} (goal {goal['goal']:g}) {verdict}")
        if not goal["met"] and "why" in goal:
            print(f"    {goal['why']}")


#: ``--large-dataset-dynamics-rows`` default: the README's ``large_dataset.py`` command.
LARGE_DATASET_DYNAMICS_ROWS = 200_000
#: ``benchmarks/large_dataset.py`` refuses fewer dynamics rows than one episode.
LARGE_DATASET_MIN_ROWS = 1000


def large_dataset_command(transitions: int, dynamics_rows: int, out: Path) -> list[str]:
    """The ``benchmarks/large_dataset.py`` command line (``dynamics_rows`` 0: all rows)."""
    script = REPO / "benchmarks" / "large_dataset.py"
    command = [sys.executable, str(script), "--transitions", str(transitions)]
    if dynamics_rows:
        command += ["--dynamics-rows", str(dynamics_rows)]
    return [*command, "--json", str(out)]


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
        "--sizes", help="comma list of paper,cpu,tiny (default: paper,cpu; --quick: cpu)"
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
    known = {"paper": PAPER, "cpu": None, "tiny": TINY}
    names = (args.sizes or ("cpu" if args.quick else "paper,cpu")).split(",")
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
    report["peak_fp32_gflops"] = matmul_peak(torch.float32, matmul_n, device, rounds + 2)
    report["peak_bf16_gflops"] = matmul_peak(torch.bfloat16, matmul_n, device, rounds + 2)
    cpu_flags = [flag for flag in CPU_FLAGS if report.get(f"cpu_has_{flag}")]
    print(
        f"CPU {report.get('cpu_model', 'unknown')} (flags: {', '.join(cpu_flags) or 'none'} of "
        f"{', '.join(CPU_FLAGS)}; torch dispatch {report['torch_cpu_capability']})"
    )
    print(
        f"device {device}, {report['threads']} threads, load average {load[0]:.2f}; "
        f"matmul peak {report['peak_fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{report['peak_bf16_gflops']:.0f} bf16"
    )
    report["sizes"] = {}
    for name in names:
        size = known[name] or cpu_preset_size()
        size_rounds = rounds if args.rounds or size is not PAPER else min(rounds, 3)
        result = bench_size(size, device, size_rounds, matmul_n, args.compile)
        report["sizes"][name] = result
        print_size(result)

    if "cpu" in names:
        report.update(bench_preset_steps(device, rounds))
        print(
            f"\nCBOP stage at the CPU preset: {report['cpu_preset_steps_per_s']:.1f} gradient "
            f"steps/s now (default: rollout_dtype=auto chose "
            f"{report['cpu_preset_rollout_dtype']}), {report['cpu_preset_steps_per_s_fp32']:.1f} "
            f"with fp32 rollouts, {report['cpu_preset_steps_per_s_bf16']:.1f} with bf16 "
            f"rollouts, {report.get('cpu_preset_steps_per_s_before', math.nan):.1f} before "
            f"({report['cpu_preset_before_commit']}); host syncs per step "
            f"{report['host_syncs_per_step']} now, "
            f"{report.get('host_syncs_per_step_before', 'n/a')} before"
        )
        print(
            f"CPU time per step (all threads): {report['cpu_preset_cpu_ms_per_step']:.1f} ms now, "
            f"{report['cpu_preset_cpu_ms_per_step_fp32']:.1f} with fp32 rollouts, "
            f"{report['cpu_preset_cpu_ms_per_step_bf16']:.1f} with bf16 rollouts, "
            f"{report.get('cpu_preset_cpu_ms_per_step_before', math.nan):.1f} before, "
            f"{report.get('cpu_preset_cpu_ms_per_step_previous', math.nan):.1f} at "
            f"{report.get('cpu_preset_previous_commit')} "
            f"({report.get('cpu_preset_steps_per_s_previous', math.nan):.1f} steps/s)"
        )

    if args.compile_cpu and "cpu" in names:
        report.update(bench_compiled_target(device, rounds))
        for suffix, label in (("", "fp32"), ("_bf16", "bf16")):
            print(
                f"torch.compile of the target ({label} rollouts): CPU time per step "
                f"{report['cpu_preset_cpu_ms_per_step_compiled' + suffix]:.1f} ms compiled, "
                f"{report['cpu_preset_cpu_ms_per_step_eager' + suffix]:.1f} eager; compile "
                f"{report['compile_s' + suffix]:.0f} s ({report['compile_cpu_s' + suffix]:.0f} s "
                f"CPU) from an empty cache; |dy| max "
                f"{report['compiled_target_max_abs_diff' + suffix]:.2e}, mean/std(y) "
                f"{report['compiled_target_rel_diff' + suffix]:.2e}; pays within "
                f"{report['compile_main_job_steps']} steps: "
                f"{report['compile_pays_in_main_job' + suffix]}"
            )
        print(
            f"compile from the filled cache: {report['compile_s_warm']:.0f} s "
            f"({report['compile_cpu_s_warm']:.0f} s CPU)"
        )

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
        d, e = report["dynamics_training"], report["evaluation"]
        print(
            f"\ndynamics training ({dyn_size.dyn_members} members, {dyn_size.dyn_hidden}): "
            f"{d['dynamics_train_samples_per_s']:.0f} samples/s, "
            f"{d['dynamics_train_gflops']:.1f} GFLOP/s"
        )
        print(
            f"evaluation (hopper, {e['eval_num_envs']} episodes): vectorized "
            f"{e['eval_vectorized_steps_per_s']:.0f} env steps/s, one env at a time "
            f"{e['eval_single_env_steps_per_s']:.0f}"
        )
    if args.large_dataset:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "large.json"
            command = large_dataset_command(
                args.large_dataset, args.large_dataset_dynamics_rows, out
            )
            subprocess.run(command, check=True)
            large = json.loads(out.read_text())
        report.update({k: v for k, v in large.items() if k.startswith("large_dataset_")})
        report["large_dataset_transitions"] = large["transitions"]
        report["large_dataset_goals"] = large["goals"]
        report["large_dataset_load_average"] = large["load_average_start"]
    report["goals"] = speed_goals(report)
    print_goals(report["goals"])
    report["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    if args.json:
        atomic_json_dump(report, args.json)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
