"""The probabilistic dynamics ensemble and its TensorDict interface.

:class:`GaussianEnsemble` is the network (MBPO/PETS style, CBOP appendix B.2):
``E`` Gaussian MLP members, each mapping a standardized ``(observation,
action)`` to the mean and log-variance of the standardized target
``[next_obs - obs, reward]``. The log-variance is kept between learnable soft
bounds (``max`` init 0.5, ``min`` init -10, one pair per member and output, or with
``shared_logvar_bounds`` one pair for all members, as the authors' code has it).
With ``separate_reward`` the reward has a network of its own in each member
(the authors' code; the paper's MBPO-style model predicts both with one).

:class:`DynamicsModel` wraps it as a TensorDict module for model rollouts:
it reads ``observation``/``action`` and writes ``("next", "observation")``,
``("next", "reward")`` and ``("next", "terminated")`` using a termination
function registered in :mod:`cbop_torchrl.registry`, named by the run's task.

:func:`save_dynamics`/:func:`load_dynamics` store a model with its
normalization statistics and elite indices in a checkpoint that loads with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from cbop_torchrl.io import atomic_torch_save
from cbop_torchrl.modules.ensemble import EnsembleMLP
from cbop_torchrl.registry import get_termination

MAX_LOGVAR_INIT = 0.5
MIN_LOGVAR_INIT = -10.0
CHECKPOINT_FORMAT = 1


class GaussianEnsemble(nn.Module):
    """``E`` Gaussian MLPs predicting the state delta and the reward.

    Inputs ``[obs, action]`` and targets ``[next_obs - obs, reward]`` are
    standardized with statistics of the training split, stored as buffers
    (set them with :meth:`set_normalizer` before training).

    Args:
        obs_dim: observation size ``O``.
        action_dim: action size ``A``.
        num_members: ``E``.
        hidden_sizes: hidden layer widths (paper: four layers of 200).
        activation: hidden activation name (``silu`` or ``relu``, see ``ensemble.py``).
        separate_reward: give the reward its own ensemble of the same shape (``reward_net``,
            outputs ``[mean, raw logvar]`` of the reward) and ``net`` the state delta only.
            The outputs are the same either way: ``[next_obs - obs, reward]``.
        shared_logvar_bounds: one pair of log-variance bounds ``[1, 1, O + 1]`` for every
            member (the authors' code) instead of one pair per member ``[E, 1, O + 1]``.
        bound_groups: with ``shared_logvar_bounds``, ``G`` shared pairs ``[G, 1, O + 1]``,
            pair ``g`` shared by the ``E / G`` members ``[g * E / G, (g + 1) * E / G)``: the
            ensembles of ``G`` seeds trained as one
            (:mod:`cbop_torchrl.trainers.joint_dynamics`). 1 (the default) is the above.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        num_members: int = 30,
        hidden_sizes: Sequence[int] = (200, 200, 200, 200),
        activation: str = "silu",
        separate_reward: bool = False,
        shared_logvar_bounds: bool = False,
        bound_groups: int = 1,
    ) -> None:
        super().__init__()
        if bound_groups < 1 or num_members % bound_groups:
            raise ValueError(f"bound_groups={bound_groups} must divide num_members={num_members}")
        self.bound_groups = int(bound_groups) if shared_logvar_bounds else 1
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.num_members = num_members
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.activation = activation
        self.separate_reward = bool(separate_reward)
        self.shared_logvar_bounds = bool(shared_logvar_bounds)
        in_dim, out_dim = obs_dim + action_dim, obs_dim + 1
        self.target_dim = out_dim
        net_out = obs_dim if self.separate_reward else out_dim
        self.net = EnsembleMLP(num_members, in_dim, 2 * net_out, self.hidden_sizes, activation)
        self.reward_net = (
            EnsembleMLP(num_members, in_dim, 2, self.hidden_sizes, activation)
            if self.separate_reward
            else None
        )
        bound_members = self.bound_groups if self.shared_logvar_bounds else num_members
        self.max_logvar = nn.Parameter(torch.full((bound_members, 1, out_dim), MAX_LOGVAR_INIT))
        self.min_logvar = nn.Parameter(torch.full((bound_members, 1, out_dim), MIN_LOGVAR_INIT))
        self.register_buffer("input_mean", torch.zeros(in_dim))
        self.register_buffer("input_std", torch.ones(in_dim))
        self.register_buffer("target_mean", torch.zeros(out_dim))
        self.register_buffer("target_std", torch.ones(out_dim))

    @torch.no_grad()
    def set_normalizer(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Stores mean/std of ``inputs`` ``[N, O + A]`` and ``targets`` ``[N, O + 1]``.

        A constant column gets std 1 so that it is centred but not blown up.
        """
        for name, data in (("input", inputs), ("target", targets)):
            mean, std = data.mean(0), data.std(0)
            std = torch.where(std < 1e-6, torch.ones_like(std), std)
            getattr(self, f"{name}_mean").copy_(mean)
            getattr(self, f"{name}_std").copy_(std)

    def normalize_inputs(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[..., O]``, ``[..., A]`` -> standardized ``[..., O + A]`` (float32)."""
        inputs = torch.cat([obs.float(), action.float()], dim=-1)
        return (inputs - self.input_mean) / self.input_std

    def normalize_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Raw ``[..., O + 1]`` targets -> standardized."""
        return (targets - self.target_mean) / self.target_std

    def forward(
        self,
        inputs: torch.Tensor,
        members: torch.Tensor | None = None,
        per_member: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Standardized inputs -> standardized Gaussian ``(mean, logvar)``.

        Args:
            inputs: ``[E', B, O + A]`` if ``per_member`` else shared ``[B, O + A]``.
            members: ``[E']`` long indices of the members to run (None: all ``E``).
            per_member: whether ``inputs`` has the leading member dimension.

        Returns:
            ``mean`` and ``logvar``, both float32 ``[E', B, O + 1]``. Under
            ``torch.autocast`` the matmuls run in the autocast dtype; the
            variance bounds and everything after them stay in float32.
        """
        out = self.net(inputs, members, per_member=per_member).float()
        mean, raw_logvar = out.chunk(2, dim=-1)
        if self.reward_net is not None:
            reward = self.reward_net(inputs, members, per_member=per_member).float()
            mean = torch.cat([mean, reward[..., :1]], dim=-1)
            raw_logvar = torch.cat([raw_logvar, reward[..., 1:]], dim=-1)
        max_logvar, min_logvar = self._logvar_bounds(members)
        # Soft clamp into (min_logvar, max_logvar), differentiable in the bounds.
        logvar = max_logvar - F.softplus(max_logvar - raw_logvar)
        logvar = min_logvar + F.softplus(logvar - min_logvar)
        return mean, logvar

    def _logvar_bounds(self, members: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(max_logvar, min_logvar)`` ``[E', 1, O + 1]`` of the selected members (``[1, 1,
        O + 1]``, broadcast over the members, with ``shared_logvar_bounds``; with
        ``bound_groups`` > 1 each group's pair repeated over its members).

        Outside autograd (rollouts: every step reads the same elites) the gathered bounds
        are cached until the parameters or ``members`` change, as
        :meth:`~cbop_torchrl.modules.ensemble.EnsembleLinear.member_params` caches weights.
        """
        max_logvar, min_logvar = self.max_logvar, self.min_logvar
        if self.bound_groups > 1:  # each group's pair, repeated over its members
            per_group = self.num_members // self.bound_groups
            max_logvar = max_logvar.repeat_interleave(per_group, dim=0)
            min_logvar = min_logvar.repeat_interleave(per_group, dim=0)
            if members is None:
                return max_logvar, min_logvar
            return max_logvar[members], min_logvar[members]
        if members is None or self.shared_logvar_bounds:
            return max_logvar, min_logvar
        if (torch.is_grad_enabled() and max_logvar.requires_grad) or (
            torch.compiler.is_compiling()
        ):
            return max_logvar[members], min_logvar[members]
        key = (
            max_logvar.data_ptr(), max_logvar._version, min_logvar.data_ptr(),
            min_logvar._version, members.data_ptr(), members._version, tuple(members.shape),
        )  # fmt: skip
        cached = self.__dict__.get("_bounds_cache")
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        bounds = max_logvar[members], min_logvar[members]
        self.__dict__["_bounds_cache"] = (key, *bounds)
        return bounds

    def predict(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        members: torch.Tensor | None = None,
        per_member: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw-unit Gaussian prediction of ``[next_obs - obs, reward]``.

        Args:
            obs: ``[E', B, O]`` if ``per_member`` else ``[B, O]``.
            action: same leading shape as ``obs``, last dim ``A``.
            members: ``[E']`` member indices (None: all).
            per_member: see :meth:`forward`.

        Returns:
            ``mean`` and ``std``, float32 ``[E', B, O + 1]`` in raw target units.
        """
        mean, logvar = self(self.normalize_inputs(obs, action), members, per_member)
        mean = mean * self.target_std + self.target_mean
        std = torch.exp(0.5 * logvar) * self.target_std
        return mean, std

    def logvar_bound_penalty(self) -> torch.Tensor:
        """``sum(max_logvar) - sum(min_logvar)``, over every bound pair (one per member, or the
        shared one); scaled by ``logvar_bound_coef`` in the training loss."""
        return self.max_logvar.sum() - self.min_logvar.sum()

    def param_groups(self, weight_decay: Sequence[float]) -> list[dict]:
        """Optimizer parameter groups giving layer ``l``'s weights L2 decay ``weight_decay[l]``.

        Adam's ``weight_decay`` adds ``decay * W`` to the gradient, which is the
        gradient of MBPO's ``decay / 2 * ||W||^2`` loss term, without computing
        that term every step. Biases and log-variance bounds are not decayed.
        ``weight_decay`` has one entry per layer (hidden layers, then output); with
        ``separate_reward`` the reward network's layer ``l`` gets the same decay.
        """
        layers = self.net.layers
        if len(weight_decay) != len(layers):
            raise ValueError(
                f"weight_decay has {len(weight_decay)} entries but the network has "
                f"{len(layers)} layers (hidden layers + output layer); give one per layer"
            )
        nets = [self.net] if self.reward_net is None else [self.net, self.reward_net]
        groups = [
            {"params": [net.layers[index].weight for net in nets], "weight_decay": float(decay)}
            for index, decay in enumerate(weight_decay)
        ]
        others = [layer.bias for net in nets for layer in net.layers]
        others += [self.max_logvar, self.min_logvar]
        groups.append({"params": others, "weight_decay": 0.0})
        return groups

    def architecture(self) -> dict:
        """The constructor arguments, as plain Python values (for checkpoints)."""
        return {
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "num_members": self.num_members,
            "hidden_sizes": list(self.hidden_sizes),
            "activation": self.activation,
            "separate_reward": self.separate_reward,
            # Named only when on, so the checkpoints written before the option load as before.
            **({"shared_logvar_bounds": True} if self.shared_logvar_bounds else {}),
        }


class DynamicsModel(TensorDictModuleBase):
    """The elites of a :class:`GaussianEnsemble` as a TensorDict module for model rollouts.

    Reads ``observation`` ``[*batch, O]`` and ``action`` ``[*batch, A]``; writes
    ``("next", "observation")`` ``[*batch, O]``, ``("next", "reward")`` ``[*batch, 1]``
    (both float32, also under ``torch.autocast``) and ``("next", "terminated")``
    bool ``[*batch, 1]`` from the task's termination function.

    Two propagation schemes, chosen explicitly by ``per_member``:

    - ``per_member=True`` (TS-infinity, what CBOP uses): the first batch dim
      is the particle dim and must equal ``num_elites``; particle ``k`` is
      propagated by elite ``k``. Batch ``[K, B]`` (or ``[K, *rest]``).
    - ``per_member=False`` (MBPO-style TS-1): any batch ``[*batch]``; in
      ``sample`` mode every row is propagated by an elite drawn uniformly at
      random, in ``mean`` mode by the average of the elites' means.

    Modes: ``sample`` draws ``mean + std * eps`` from the member's Gaussian;
    ``mean`` returns the member mean. Sampling uses ``generator`` when given
    (a ``torch.Generator`` on the model's device) for reproducible rollouts.

    Args:
        ensemble: the trained network, normalization statistics included.
        termination: name of a registered termination function (``hopper``,
            ``none``, ...); it decides ``("next", "terminated")``.
        elites: indices of the elite members, in particle order.
        mode: ``"sample"`` or ``"mean"``.
        per_member: propagation scheme (see above).
        generator: optional ``torch.Generator`` for the Gaussian/elite draws.
    """

    in_keys = ["observation", "action"]
    out_keys = [("next", "observation"), ("next", "reward"), ("next", "terminated")]
    MODES = ("sample", "mean")

    def __init__(
        self,
        ensemble: GaussianEnsemble,
        termination: str,
        elites: Sequence[int] | torch.Tensor | None = None,
        mode: str = "sample",
        per_member: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.ensemble = ensemble
        self.termination = termination
        self.termination_fn = get_termination(termination)
        self.mode = self._check_mode(mode)
        self.per_member = per_member
        self.generator = generator
        if elites is None:
            elites = range(ensemble.num_members)
        elites = torch.as_tensor(list(map(int, elites)), dtype=torch.long)
        if elites.numel() == 0 or elites.min() < 0 or elites.max() >= ensemble.num_members:
            raise ValueError(
                f"elite indices {elites.tolist()} must be a non-empty subset of "
                f"0..{ensemble.num_members - 1}"
            )
        self.register_buffer("elite_indices", elites.to(ensemble.input_mean.device))
        # Running all members in their stored order needs no weight gather.
        self._elites_are_all = torch.equal(elites, torch.arange(ensemble.num_members))

    @property
    def num_elites(self) -> int:
        return self.elite_indices.numel()

    def _check_mode(self, mode: str) -> str:
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        return mode

    def _members(self) -> torch.Tensor | None:
        return None if self._elites_are_all else self.elite_indices

    def _noise(self, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)

    def predict_next(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        mode: str | None = None,
        per_member: bool | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensors in, ``(next_obs [*batch, O], reward [*batch, 1])`` out; see :meth:`forward`."""
        mode = self.mode if mode is None else self._check_mode(mode)
        per_member = self.per_member if per_member is None else per_member
        generator = self.generator if generator is None else generator
        obs_dim = self.ensemble.obs_dim
        batch_shape = obs.shape[:-1]
        if per_member:
            if obs.dim() < 2 or obs.shape[0] != self.num_elites:
                raise ValueError(
                    f"per_member=True needs a leading particle dim equal to num_elites="
                    f"{self.num_elites}, but observation has shape {tuple(obs.shape)}; "
                    "expand the batch to [num_elites, B] or use per_member=False"
                )
            flat_obs, flat_action = obs, action
            if obs.dim() != 3:  # a reshape to the same shape is still an operation
                flat_obs = obs.reshape(self.num_elites, -1, obs_dim)
                flat_action = action.reshape(self.num_elites, -1, action.shape[-1])
            mean, std = self.ensemble.predict(flat_obs, flat_action, self._members(), True)
            target = mean if mode == "mean" else mean + std * self._noise(mean, generator)
        else:
            flat_obs = obs.reshape(-1, obs_dim)
            flat_action = action.reshape(-1, action.shape[-1])
            mean, std = self.ensemble.predict(flat_obs, flat_action, self._members(), False)
            if mode == "mean":
                target = mean.mean(0)
            else:
                # One uniformly drawn elite per row (MBPO's TS-1 propagation).
                pick = torch.randint(
                    self.num_elites,
                    (1, mean.shape[1], 1),
                    generator=generator,
                    device=mean.device,
                ).expand(1, -1, mean.shape[-1])
                sample = mean + std * self._noise(mean, generator)
                target = sample.gather(0, pick).squeeze(0)
        if target.shape[:-1] != batch_shape:
            target = target.reshape(*batch_shape, obs_dim + 1)
        delta, reward = target.split([obs_dim, 1], dim=-1)
        return obs.float() + delta, reward

    def rollout_step(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward` on tensors, for model rollouts: ``(next_obs, reward, terminated)``.

        ``next_obs`` ``[*batch, O]`` and ``reward`` ``[*batch, 1]`` as :meth:`forward` writes
        them, ``terminated`` ``[*batch]`` bool (no trailing unit dimension), with the
        constructor's mode, scheme and generator; no TensorDict in or out.
        """
        next_obs, reward = self.predict_next(obs, action)
        return next_obs, reward, self.termination_fn(next_obs)

    def forward(
        self,
        tensordict: TensorDictBase,
        mode: str | None = None,
        per_member: bool | None = None,
        generator: torch.Generator | None = None,
    ) -> TensorDictBase:
        """Writes the model's next observation, reward and termination into ``tensordict``.

        ``mode``, ``per_member`` and ``generator`` override the constructor's values.
        """
        next_obs, reward = self.predict_next(
            tensordict.get("observation"), tensordict.get("action"), mode, per_member, generator
        )
        tensordict.set(("next", "observation"), next_obs)
        tensordict.set(("next", "reward"), reward)
        tensordict.set(("next", "terminated"), self.termination_fn(next_obs).unsqueeze(-1))
        return tensordict


def save_dynamics(model: DynamicsModel, path: str | Path, metadata: dict | None = None) -> Path:
    """Atomically writes ``model`` (weights, normalization, elites, termination) to ``path``.

    ``metadata`` (plain Python values only) is stored alongside, e.g. the
    training config. Load with :func:`load_dynamics`.
    """
    return atomic_torch_save(dynamics_state(model, metadata), path)


def dynamics_state(model: DynamicsModel, metadata: dict | None = None) -> dict:
    """What :func:`save_dynamics` writes: plain values and tensors only."""
    return {
        "format": CHECKPOINT_FORMAT,
        "architecture": model.ensemble.architecture(),
        "termination": model.termination,
        "elites": model.elite_indices.tolist(),
        "state_dict": {k: v.detach().cpu() for k, v in model.ensemble.state_dict().items()},
        "metadata": metadata or {},
    }


def load_dynamics(
    path: str | Path,
    device: torch.device | str | None = None,
    mode: str = "sample",
    per_member: bool = True,
    termination: str | None = None,
) -> DynamicsModel:
    """Rebuilds the :class:`DynamicsModel` saved by :func:`save_dynamics`.

    Loads with ``weights_only=True``. The termination function (the stored one,
    or ``termination`` when given) must be registered in
    :mod:`cbop_torchrl.registry`; it is stored by name, not pickled.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return dynamics_from_state(checkpoint, path, device, mode, per_member, termination)


def dynamics_from_state(
    checkpoint: dict,
    path: str | Path,
    device: torch.device | str | None = None,
    mode: str = "sample",
    per_member: bool = True,
    termination: str | None = None,
) -> DynamicsModel:
    """The :class:`DynamicsModel` of a state :func:`dynamics_state` made (read from ``path``)."""
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} is not a dynamics checkpoint of format {CHECKPOINT_FORMAT} "
            f"(found format {checkpoint.get('format')!r}); retrain or re-save it"
        )
    ensemble = GaussianEnsemble(**checkpoint["architecture"])
    ensemble.load_state_dict(checkpoint["state_dict"])
    if termination is None:
        # Files written before tasks existed name the family; its termination has that name.
        termination = checkpoint.get("termination", checkpoint.get("family"))
    model = DynamicsModel(
        ensemble, termination, checkpoint["elites"], mode=mode, per_member=per_member
    )
    return model.to(device) if device is not None else model


def load_dynamics_metadata(path: str | Path) -> dict:
    """The ``metadata`` dict stored by :func:`save_dynamics`."""
    return torch.load(path, map_location="cpu", weights_only=True)["metadata"]
