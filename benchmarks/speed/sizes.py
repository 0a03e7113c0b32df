"""The benchmark's sizes (batch B, particles K, Q-networks M, horizon H) and FLOP counts."""

from __future__ import annotations

from dataclasses import dataclass, replace

import yaml

from benchmarks.speed import REPO
from cbop_torchrl.envs import read_env_specs
from cbop_torchrl.registry import get_family


@dataclass
class Size:
    """One benchmark configuration (B, K, M, H as in the paper)."""

    name: str
    batch: int  # B
    particles: int  # K (= dynamics elites)
    members: int  # M (Q-ensemble)
    horizon: int  # H
    hidden: tuple[int, ...]  # actor hidden widths (and the critics' unless critic_hidden)
    dyn_hidden: tuple[int, ...]  # dynamics hidden widths
    dyn_members: int  # dynamics ensemble size (>= K)
    family: str = "walker2d"
    critic_hidden: tuple[int, ...] | None = None  # the critics' widths when not ``hidden``

    @property
    def q_hidden(self) -> tuple[int, ...]:
        """The Q-networks' hidden widths."""
        return self.critic_hidden or self.hidden


PAPER = Size("paper", 256, 20, 20, 10, (256, 256, 256), (200,) * 4, 30)
#: The paper's hopper settings: M = 50 critics (the other tasks: 20), the rest as PAPER.
PAPER_HOPPER = Size("paper-hopper", 256, 20, 50, 10, (256, 256, 256), (200,) * 4, 30, "hopper")
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
    critic_hidden = get("agent", "critic_hidden_sizes")
    return Size(
        "cpu",
        batch=int(get("train", "batch_size", 256)),
        particles=int(get("dynamics", "num_elites", dyn["num_elites"])),
        members=int(get("agent", "num_qvalue_nets", 20)),
        horizon=int(get("estimator", "horizon", 10)),
        hidden=tuple(int(h) for h in get("agent", "hidden_sizes")),
        dyn_hidden=dyn_hidden,
        dyn_members=int(get("dynamics", "num_members", dyn["num_members"])),
        critic_hidden=tuple(int(h) for h in critic_hidden) if critic_hidden else None,
    )


def cpu_deep_critics_size(cpu: Size) -> Size:
    """``cpu`` (:func:`cpu_preset_size`) with the paper's critics (3x256) and batch (256).

    The actor is unchanged: docs/learning.md Experiments 32-33
    (``agent.critic_hidden_sizes=[256,256,256] train.batch_size=256``).
    """
    return replace(cpu, name="cpu-c3x256b256", batch=256, critic_hidden=(256, 256, 256))


def cpu_shallow_critics_size(cpu: Size) -> Size:
    """``cpu`` with critics as wide as its actor (2x256): the CPU preset before commit 5bc7ba6.

    What the preset's switch to 3x256 critics (docs/learning.md, Experiment 34) costs.
    """
    return replace(cpu, name="cpu-c2x256", critic_hidden=cpu.hidden)


def env_sizes(family: str) -> tuple[int, int]:
    """Observation and action sizes of a known family's environment (from its TorchRL specs)."""
    specs = read_env_specs(get_family(family))
    return specs.observation_shape[-1], specs.action_shape[-1]


def mlp_flops(sizes: list[int]) -> int:
    """FLOPs of one row through an MLP with layer widths ``sizes`` (2 x multiply-adds)."""
    return 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=False))


def flop_counts(size: Size, obs_dim: int, act_dim: int) -> dict[str, int]:
    f_q = mlp_flops([obs_dim + act_dim, *size.q_hidden, 1])
    f_pi = mlp_flops([obs_dim, *size.hidden, 2 * act_dim])
    f_dyn = mlp_flops([obs_dim + act_dim, *size.dyn_hidden, 2 * (obs_dim + 1)])
    B, K, M, H = size.batch, size.particles, size.members, size.horizon
    target = (H + 1) * K * B * (M * f_q + f_pi) + H * K * B * f_dyn
    update = target + 11 * B * M * f_q + 3 * B * f_pi
    sac = 11 * B * M * f_q + 6 * B * f_pi  # SAC's own bootstrap + the same passes, no EDAC term
    return {"target": target, "update": update, "sac_update": sac}
