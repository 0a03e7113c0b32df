"""CBOP's value estimator: the CBOP target as a TorchRL ``ValueEstimatorBase``.

The maths (model rollouts, h-step returns, the posterior, the LCB, the soft Bellman
target) are pure tensor functions in :mod:`cbop_torchrl.objectives.cbop_target`. This
module wires them to networks: :class:`CBOPValueEstimator` samples ``a' ~ pi(.|s')``
(shared by the particles, so horizon 0 is exactly the model-free SAC bootstrap), hands the
rollout the dynamics model (particle k with elite k, TS-infinity), the actor's distribution
and the target Q-ensemble (``torch.vmap`` over the stacked ``[M, ...]`` parameters), and
returns ``y = r + gamma (1 - terminated) (mu - psi sigma - alpha log pi(a'|s'))``, all in
float32. Its settings are a :class:`CBOPSettings`.

This is the eager form, the paper's operations one module call at a time. The fast forms
of the same target (fused Q-ensembles, a plain actor's matmuls, bf16 rollouts and their
automatic choice, torch.compile) are in :mod:`cbop_torchrl.accel`:
``accel.accelerate(estimator)`` turns them on.

The estimator owns no parameters: it reads the actor, the target Q parameters
and alpha from a loss (:meth:`CBOPValueEstimator.from_sac_loss`) or from the
objects given to the constructor, and keeps the dynamics model as a plain
reference. Registering it in a loss (``loss.make_value_estimator(estimator)``)
therefore adds nothing to the loss's ``state_dict`` or ``parameters()``; move
the dynamics model to the loss's device yourself.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives.value import ValueEstimatorBase

from cbop_torchrl._torchrl_compat import vmap_over_params
from cbop_torchrl.objectives.cbop_settings import (
    FIXED_WEIGHTINGS,
    MODES,
    SAMPLINGS,
    TERMINATIONS,
    CBOPSettings,
)
from cbop_torchrl.objectives.cbop_target import (
    horizon_value,
    soft_bellman_target,
    target_diagnostics,
)
from cbop_torchrl.objectives.cbop_target import (
    rollout_returns as model_returns,
)
from cbop_torchrl.objectives.posterior import fixed_weights


def sac_alpha(loss: Any) -> torch.Tensor:
    """A ``SACLoss``'s ``exp(log_alpha)`` within its bounds, detached (SACLoss's alpha).

    Read from the loss's public ``log_alpha``, ``min_log_alpha`` and ``max_log_alpha``: the
    alpha of the actor's loss (:class:`~cbop_torchrl.objectives.loss.CBOPLoss`) and of the
    target's entropy term.
    """
    log_alpha = loss.log_alpha.detach()
    if loss.min_log_alpha is not None or loss.max_log_alpha is not None:
        log_alpha = log_alpha.clamp(loss.min_log_alpha, loss.max_log_alpha)
    return log_alpha.exp()


def _q_ensemble(
    qvalue_network: TensorDictModuleBase | Sequence[TensorDictModuleBase],
    qvalue_params: TensorDictBase | None,
) -> tuple[TensorDictModuleBase, TensorDictBase]:
    """One Q-network and the ensemble's stacked ``[M, ...]`` parameters."""
    if isinstance(qvalue_network, (list, tuple)):
        if qvalue_params is not None:
            raise ValueError("Pass either a list of Q-networks or qvalue_params, not both.")
        return qvalue_network[0], TensorDict.from_modules(*qvalue_network, as_module=True)
    if qvalue_params is None:
        raise ValueError(
            "qvalue_network is a single network: pass its stacked [M, ...] parameters as "
            "qvalue_params, or pass the ensemble as a list of networks."
        )
    return qvalue_network, qvalue_params


class CBOPValueEstimator(ValueEstimatorBase):
    """The CBOP target ``y`` as a TorchRL value estimator.

    Args:
        actor_network: the policy, a ``ProbabilisticActor`` reading ``obs_key``
            and sampling ``action_key`` (e.g. :func:`make_actor`). Its current
            parameters are used (SAC has no target actor).
        qvalue_network: the target Q-ensemble: either a list of M Q-networks
            (``observation``, ``action`` -> ``state_action_value``) whose
            parameters are stacked, or one network run with ``qvalue_params``.
        dynamics: a TensorDict module reading ``observation``/``action`` with
            batch ``[K, N]`` and writing ``("next", "observation")``,
            ``("next", "reward")`` ``[..., 1]`` and ``("next", "terminated")``
            ``[..., 1]``, particle k with elite k (:class:`DynamicsModel`).
        qvalue_params: ``[M, ...]`` parameters for a single ``qvalue_network``.
        actor_params: parameters to load into ``actor_network`` for the call
            (``None``: its own).
        alpha: entropy coefficient: a float, a scalar tensor or a zero-argument
            callable returning one (read at every call).
        settings: a :class:`CBOPSettings`, or none and its fields as keywords
            (``gamma``, ``horizon``, ``psi``, ``mode``, ..., see :class:`CBOPSettings`);
            the estimator keeps them as attributes of the same names.
    """

    def __init__(
        self,
        *,
        actor_network: TensorDictModuleBase,
        qvalue_network: TensorDictModuleBase | Sequence[TensorDictModuleBase],
        dynamics: TensorDictModuleBase,
        qvalue_params: TensorDictBase | None = None,
        actor_params: TensorDictBase | None = None,
        alpha: float | torch.Tensor | Callable[[], torch.Tensor] = 0.0,
        settings: CBOPSettings | None = None,
        **options: Any,
    ) -> None:
        if settings is None:
            settings = CBOPSettings(**options)
        elif options:
            raise TypeError(f"pass settings= or its keywords, not both; got {sorted(options)}.")
        super().__init__(value_network=None, deactivate_vmap=settings.deactivate_vmap)
        settings = settings.for_dynamics(dynamics)
        #: The settings as constructed (the attributes below may be changed later).
        self.settings = settings
        self.gamma, self.horizon, self.psi = settings.gamma, settings.horizon, settings.psi
        self.mode, self.termination, self.sampling = (
            settings.mode, settings.termination, settings.sampling,
        )  # fmt: skip
        self.quantile, self.num_particles = settings.quantile, settings.num_particles
        self.var_floor, self.unbiased_variance = settings.var_floor, settings.unbiased_variance
        self.obs_key, self.action_key = settings.obs_key, settings.action_key
        self.q_value_key = settings.q_value_key
        self._fixed_weights = None
        if self.mode == "fixed":
            lmbda = None if settings.fixed_weighting == "uniform" else settings.lmbda
            self._fixed_weights = fixed_weights(self.horizon, lmbda)

        # Everything below is referenced, not registered: see the module doc.
        qvalue_network, qvalue_params = _q_ensemble(qvalue_network, qvalue_params)
        self.__dict__.update(
            actor_network=actor_network, qvalue_network=qvalue_network, dynamics=dynamics,
            _own_sources={"actor_params": actor_params, "qvalue_params": qvalue_params,
                          "alpha": alpha},
            _loss=None,
        )  # fmt: skip
        self._vmap_q = vmap_over_params(
            qvalue_network, (None, 0), self.vmap_randomness, loop=settings.deactivate_vmap
        )
        self._seed_stream = None if settings.seed is None else random.Random(int(settings.seed))
        #: Detached diagnostics of the last call (a TensorDict with batch ``[]``).
        self.last_diagnostics: TensorDictBase | None = None

    @classmethod
    def from_sac_loss(
        cls,
        loss: Any,
        dynamics: TensorDictModuleBase,
        **kwargs: Any,
    ) -> CBOPValueEstimator:
        """An estimator wired to a TorchRL ``SACLoss`` (or :class:`CBOPLoss`).

        It reads, at every call, the loss's actor parameters, its TARGET
        Q-ensemble parameters and its current alpha, so it follows training and
        target updates without copying anything. Keys come from the loss's
        actor/Q ``in_keys``. Pass it back with ``loss.make_value_estimator(est)``.

        Args:
            loss: the SAC loss (version 2: no state-value network).
            dynamics: see the class doc.
            **kwargs: :class:`CBOPSettings` keywords (``gamma``, ``horizon``, ``psi``, ...).
        """
        if getattr(loss, "_version", 2) != 2:
            raise ValueError(
                "from_sac_loss needs a SACLoss without a value_network (SAC v2); the CBOP "
                "target replaces the Q bootstrap, not a state-value network."
            )
        kwargs.setdefault("obs_key", loss.actor_network.in_keys[0])
        kwargs.setdefault("action_key", loss.tensor_keys.action)
        kwargs.setdefault("q_value_key", loss.tensor_keys.state_action_value)
        kwargs.setdefault("deactivate_vmap", loss.deactivate_vmap)
        estimator = cls(
            actor_network=loss.actor_network,
            qvalue_network=loss.qvalue_network,
            # Only for the structure checks: the TARGET parameters are read from
            # the loss at call time (reading them now would warn that no target
            # updater is attached yet).
            qvalue_params=loss.qvalue_network_params,
            dynamics=dynamics,
            **kwargs,
        )
        estimator.__dict__["_loss"] = loss
        estimator.__dict__["_own_sources"] = {}
        estimator.set_vmap_randomness(loss.vmap_randomness)
        estimator._vmap_q = vmap_over_params(
            loss.qvalue_network, (None, 0), loss.vmap_randomness, loop=estimator.deactivate_vmap
        )
        return estimator

    # ----------------------------------------------------------------- sources
    def _actor_params(self) -> TensorDictBase | None:
        loss = self.__dict__["_loss"]
        return loss.actor_network_params if loss is not None else self._own_sources["actor_params"]

    def _qvalue_params(self, target_params: TensorDictBase | None) -> TensorDictBase:
        if target_params is not None:
            return target_params
        loss = self.__dict__["_loss"]
        if loss is not None:
            return loss.target_qvalue_network_params
        return self._own_sources["qvalue_params"]

    def _alpha(self) -> torch.Tensor | float:
        loss = self.__dict__["_loss"]
        if loss is not None:
            return sac_alpha(loss)
        alpha = self._own_sources["alpha"]
        return alpha() if callable(alpha) else alpha

    # ------------------------------------------------------------- TorchRL API
    @property
    def in_keys(self) -> list:
        return [
            ("next", self.obs_key),
            ("next", self.tensor_keys.reward),
            ("next", self.tensor_keys.terminated),
        ]

    @property
    def out_keys(self) -> list:
        return [self.tensor_keys.value_target]

    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        params: TensorDictBase | None = None,
        target_params: TensorDictBase | None = None,
    ) -> TensorDictBase:
        """Writes the target ``[*batch, 1]`` under ``tensor_keys.value_target``."""
        target = self.value_estimate(tensordict, target_params=target_params)
        tensordict.set(self.tensor_keys.value_target, target)
        return tensordict

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        target_params: TensorDictBase | None = None,
        next_value: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The CBOP target ``y`` ``[*batch, 1]`` (no gradient); diagnostics in ``last_diagnostics``.

        ``("next", "state_value")``, which ``SACLoss`` writes before calling
        this, is ignored: the rollout computes its own bootstrap.
        """
        if next_value is not None:
            raise ValueError(
                "CBOPValueEstimator computes its own bootstrap from model rollouts; "
                "next_value cannot be given."
            )
        target, diagnostics = self.compute_target(tensordict, target_params=target_params)
        self.last_diagnostics = diagnostics
        return target

    # ------------------------------------------------------- networks and RNG
    def _rng_context(self, device: torch.device):
        if self._seed_stream is None:
            return contextlib.nullcontext()
        seed = self._seed_stream.getrandbits(62)  # Python's RNG: no tensor read back
        devices = [device] if device.type == "cuda" else []
        stack = contextlib.ExitStack()
        stack.enter_context(torch.random.fork_rng(devices=devices))
        torch.manual_seed(seed)
        return stack

    def _sample_action(
        self, obs: torch.Tensor, with_log_prob: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``a ~ pi(.|obs)`` ``[*b, A]`` (and ``log pi`` ``[*b]``) from the actor's distribution.

        The actor runs with the parameters :meth:`_actor_loaded` put in (once per rollout).
        """
        td = TensorDict({self.obs_key: obs}, batch_size=obs.shape[:-1])
        dist = self.actor_network.get_dist(td)
        if with_log_prob:
            return rsample_and_log_prob(dist)
        return dist.sample(), None

    def _q_values(
        self, obs: torch.Tensor, action: torch.Tensor, params: TensorDictBase
    ) -> torch.Tensor:
        """Every member on every row: ``[R, O], [R, A] -> [M, R]`` (``vmap`` over ``params``)."""
        td = TensorDict({self.obs_key: obs, self.action_key: action}, batch_size=obs.shape[:1])
        return self._vmap_q(td, params).get(self.q_value_key).squeeze(-1)

    def _model_step(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One dynamics step of ``[K, R]`` particles: next observation, reward, terminated."""
        step_td = TensorDict({self.obs_key: obs, self.action_key: action}, batch_size=obs.shape[:2])
        step_td = self.dynamics(step_td)
        return (
            step_td.get(("next", self.obs_key)),
            step_td.get(("next", self.tensor_keys.reward)),
            step_td.get(("next", self.tensor_keys.terminated)).squeeze(-1),
        )

    def _actor_loaded(self):
        """A context in which ``actor_network`` runs with the parameters to use (loss's or own)."""
        params = self._actor_params()
        if params is None:
            return contextlib.nullcontext()
        return params.to_module(self.actor_network)

    # --------------------------------------------------------------- the target
    @torch.no_grad()
    def rollout_returns(
        self, next_obs: torch.Tensor, target_params: TensorDictBase | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The h-step samples from ``s'`` (:func:`.cbop_target.rollout_returns`).

        Args:
            next_obs: ``[N, O]`` the dataset's next observations ``s'``.
            target_params: optional ``[M, ...]`` Q parameters overriding the target ones.

        Returns:
            ``returns`` ``(N, H+1, K, M)``, ``valid`` bool ``(N, H+1)`` (horizons
            before any particle's termination) and ``log pi(a'|s')`` ``[N]``.
        """
        with self._actor_loaded():  # once for the rollout's H + 1 actor passes
            return self._rollout_returns(next_obs, target_params)

    def _rollout_returns(
        self, next_obs: torch.Tensor, target_params: TensorDictBase | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_params = self._qvalue_params(target_params)
        first_action, log_prob = self._sample_action(next_obs, with_log_prob=True)
        returns, valid = model_returns(
            next_obs,
            first_action,
            step=self._model_step,
            sample=lambda obs: self._sample_action(obs, with_log_prob=False)[0],
            q_values=lambda obs, action: self._q_values(obs, action, q_params),
            horizon=self.horizon,
            particles=self.num_particles,
            gamma=self.gamma,
            sampling=self.sampling,
            termination=self.termination,
        )
        return returns, valid, log_prob

    @torch.no_grad()
    def compute_target(
        self,
        tensordict: TensorDictBase,
        target_params: TensorDictBase | None = None,
    ) -> tuple[torch.Tensor, TensorDictBase]:
        """``y`` ``[*batch, 1]`` and the diagnostics (a TensorDict, batch ``[]``).

        Reads ``("next", obs_key)``, ``("next", "reward")`` and
        ``("next", "terminated")`` from ``tensordict`` (any batch shape).

        Diagnostics (all means over the batch):
            ``weights`` ``(H+1,)`` posterior ``w_h``; ``expected_horizon`` ``E[h]``;
            ``posterior_std`` ``sigma``; ``value_var_share`` ``(H+1,)`` ``A/(A+B)``;
            ``valid_fraction`` ``(H+1,)`` share of transitions whose horizon h
            kept its precision; ``target_mean`` mean ``y``. In the ``fixed`` and
            ``quantile`` modes the posterior quantities are still reported for
            comparison, though they do not enter ``y``.
        """
        batch_shape = tensordict.batch_size
        flat = tensordict.reshape(-1)
        next_obs = flat.get(("next", self.obs_key))
        reward = flat.get(("next", self.tensor_keys.reward)).float().reshape(-1)
        terminated = flat.get(("next", self.tensor_keys.terminated)).reshape(-1)
        target_fn = self._target_function(next_obs.device)
        with self._rng_context(next_obs.device):
            target, diagnostics = target_fn(next_obs, reward, terminated, target_params)
        diagnostics = TensorDict(diagnostics, batch_size=[])
        return target.reshape(*batch_shape, 1), diagnostics

    def _target_function(self, device: torch.device) -> Callable[..., Any]:
        """The function computing the target's tensors on ``device``: :meth:`_target_tensors`
        (:mod:`cbop_torchrl.accel` hands out a compiled one)."""
        return self._target_tensors

    def _target_tensors(
        self,
        next_obs: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        target_params: TensorDictBase | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``y`` ``[N]`` and the diagnostics from ``s'`` ``[N, O]``, ``r``, ``terminated`` ``[N]``.

        The target's tensor part, without TensorDict inputs or outputs: what
        :mod:`cbop_torchrl.accel`'s ``torch.compile`` of the target wraps.
        """
        returns, valid, log_prob = self.rollout_returns(next_obs, target_params)
        weights = self._fixed_weights
        if weights is not None and weights.device != returns.device:  # moved once, not per call
            weights = self._fixed_weights = weights.to(returns.device)
        value, post, sigma = horizon_value(
            returns, valid, self.mode, self.psi, self.var_floor, weights, self.quantile,
            self.unbiased_variance,
        )  # fmt: skip
        target = soft_bellman_target(reward, terminated, self.gamma, value, self._alpha(), log_prob)
        return target, target_diagnostics(post, sigma, valid, target)


__all__ = [
    "CBOPSettings",
    "CBOPValueEstimator",
    "FIXED_WEIGHTINGS",
    "MODES",
    "SAMPLINGS",
    "TERMINATIONS",
    "sac_alpha",
]
