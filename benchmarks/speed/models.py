"""Random-weight models and synthetic walker2d-shaped transitions at a benchmark size.

The dynamics' normalization keeps rollouts in walker2d's healthy range (few
terminations); timings do not depend on the weights.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from benchmarks.speed.sizes import Size, env_sizes
from cbop_torchrl.modules.actor_critic import make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.registry import get_family


def build_models(size: Size, device: torch.device, seed: int = 0):
    """Actor, M Q-networks, a dynamics model (K elites) and a batch of transitions."""
    torch.manual_seed(seed)
    family = get_family(size.family)
    obs_dim, act_dim = env_sizes(size.family)
    actor = make_actor(obs_dim, act_dim, size.hidden, device=device)
    qnets = make_qvalue_ensemble(size.members, obs_dim, act_dim, size.q_hidden, device=device)
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
