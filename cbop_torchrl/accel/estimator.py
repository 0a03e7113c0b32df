"""CBOP's value estimator with its fast paths: the same target, computed faster.

:class:`EstimatorFastPaths` replaces the eager estimator's network calls
(:class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator`: the actor's distribution,
``vmap`` over the Q-ensemble, the dynamics as a TensorDict module) with the forms
:class:`~cbop_torchrl.accel.FastPaths` selects:

- a plain Q-ensemble as one ``baddbmm`` per layer over the stacked ``[M, ...]`` weights, in
  row blocks (:func:`~cbop_torchrl.accel.plans.fused_q_values`), compiled with CUDA graphs
  on CUDA with ``compile``;
- a plain actor as its matmuls on weights cast and transposed once per rollout
  (:func:`~cbop_torchrl.accel.plans.actor_layers`);
- a :class:`~cbop_torchrl.modules.dynamics.DynamicsModel` stepped on tensors
  (:meth:`~cbop_torchrl.modules.dynamics.DynamicsModel.rollout_step`, no TensorDict per step);
- the rollout's matmuls in bf16 (``rollout_dtype``; :mod:`cbop_torchrl.accel.rollout_dtype`);
- with ``compile`` on a CPU or inside a captured step, the whole target's tensor part
  compiled by inductor.

:class:`CBOPValueEstimator` is the eager class with them, built with the eager keywords
plus :class:`~cbop_torchrl.accel.FastPaths`'s; :func:`accelerate_estimator` gives an eager
estimator them in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.modules.distributions.utils import rsample_and_log_prob

from cbop_torchrl.accel.classes import fast_class
from cbop_torchrl.accel.fused_mlp import fused_mlp_ensemble, plain_mlp_plan
from cbop_torchrl.accel.plans import (
    ActorLayers,
    actor_layers,
    default_q_chunk_rows,
    fused_q_values,
    plain_actor_dist_params,
    plain_actor_plan,
)
from cbop_torchrl.accel.rollout_dtype import (
    BF16_TOLERANCE,
    measure_bf16_error,
    select_rollout_dtype,
)
from cbop_torchrl.accel.settings import FastPaths
from cbop_torchrl.modules.actor_critic import BoxTanhNormal
from cbop_torchrl.modules.dynamics import DynamicsModel
from cbop_torchrl.objectives import estimator as eager
from cbop_torchrl.objectives.cbop_target import rollout_returns as model_returns


class EstimatorFastPaths:
    """The fast paths of a CBOP value estimator (a mixin before the eager class).

    Attributes (set by :meth:`_init_fast_paths`; the first four may be changed later):
        rollout_dtype: ``torch.float32`` or ``torch.bfloat16``.
        q_chunk_rows: rows per block of the fused Q-ensemble (``"auto"``, an int or None).
        compile: see :class:`~cbop_torchrl.accel.FastPaths`.
        whole_step_graph: whether the step computing the target is captured as one CUDA
            graph (the CBOP stage's ``cuda_graph``). With ``compile`` on CUDA that capture
            records the whole target compiled by inductor without CUDA graphs of its own
            (graphs cannot nest); otherwise ``compile`` runs the Q-ensemble through
            ``mode="reduce-overhead"``.
        fast_paths: the :class:`~cbop_torchrl.accel.FastPaths` it was given.
    """

    def _init_fast_paths(self, paths: FastPaths) -> None:
        self.fast_paths = paths
        self.rollout_dtype, self.q_chunk_rows = paths.rollout_dtype, paths.q_chunk_rows
        self.compile, self.whole_step_graph = paths.compile, paths.whole_step_graph
        fused = paths.fused_q and not self.settings.deactivate_vmap
        keys = (self.obs_key, self.action_key, self.q_value_key)
        self._mlp_plan = plain_mlp_plan(self.qvalue_network, *keys) if fused else None
        self._actor_plan = (
            plain_actor_plan(self.actor_network, self.obs_key) if paths.fused_q else None
        )
        # A DynamicsModel (whose forward is its own) steps on tensors: no TensorDict per step.
        dynamics = self.dynamics
        self._tensor_dynamics = (
            isinstance(dynamics, DynamicsModel) and type(dynamics).forward is DynamicsModel.forward
        )
        self._compiled_q: Callable[..., torch.Tensor] | None = None
        self._compiled_target: Callable[..., Any] | None = None
        self._eager_only = False  # set while measure_bf16_error runs (no compile per dtype)

    # ------------------------------------------------------- rollout precision
    def measure_bf16_error(self, tensordict: TensorDictBase, seed: int = 0) -> float:
        """The bf16 target error here: :func:`.rollout_dtype.measure_bf16_error`."""
        return measure_bf16_error(self, tensordict, seed)

    def select_rollout_dtype(
        self, tensordict: TensorDictBase, tolerance: float = BF16_TOLERANCE
    ) -> dict[str, Any]:
        """Chooses ``rollout_dtype`` here: :func:`.rollout_dtype.select_rollout_dtype`."""
        return select_rollout_dtype(self, tensordict, tolerance)

    def _autocast(self, device: torch.device):
        if self.rollout_dtype == torch.float32:
            return contextlib.nullcontext()
        # Inside a CUDA graph capture autocast must not cache its weight casts (PyTorch's
        # CUDA-graph notes): the cached copies would outlive the capture's allocations.
        # Compiled code keeps no autocast cache: the capture query stays out of dynamo's trace.
        capturing = (
            device.type == "cuda"
            and not torch.compiler.is_compiling()
            and torch.cuda.is_current_stream_capturing()
        )
        return torch.autocast(
            device_type=device.type, dtype=self.rollout_dtype, cache_enabled=not capturing
        )

    # ---------------------------------------------------------------- networks
    def _actor_layers(self) -> ActorLayers | None:
        """A plain actor's layers for this rollout (:func:`actor_layers`); None for another."""
        if self._actor_plan is None:
            return None
        params = self._actor_params()
        if params is None:
            params = TensorDict.from_module(self.actor_network)
        return actor_layers(params, self._actor_plan, self.rollout_dtype)

    def _sample_action(
        self, obs: torch.Tensor, with_log_prob: bool, layers: ActorLayers | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``a ~ pi(.|obs)`` ``[*b, A]`` (and ``log pi`` ``[*b]``); dist maths in fp32.

        With ``layers`` (:meth:`_actor_layers`, a plain actor) the actor's operations run
        on them directly; otherwise the actor runs as it is: callers load the actor
        parameters first (:meth:`_actor_loaded`, once per rollout rather than once per step).
        """
        actor = self.actor_network
        if layers is not None:
            loc, scale = plain_actor_dist_params(
                obs, layers, self.rollout_dtype, cast=with_log_prob
            )
            if not with_log_prob:
                # BoxTanhNormal's draw on [-1, 1]: tanh(loc + eps * scale), eps ~ N(0, 1), in
                # float32 (the fp32 eps takes a bf16 loc and scale to fp32 exactly).
                eps = torch.randn(loc.shape, dtype=torch.float32, device=loc.device)
                action = torch.tanh(loc + eps * scale)
                if obs.dim() == 2:
                    return action, None
                return action.view(*obs.shape[:-1], action.shape[-1]), None
            if obs.dim() != 2:
                loc, scale = (x.view(*obs.shape[:-1], x.shape[-1]) for x in (loc, scale))
            # A plain actor's distribution (plain_actor_plan): BoxTanhNormal on [-1, 1].
            return rsample_and_log_prob(BoxTanhNormal(loc, scale))
        td = TensorDict({self.obs_key: obs}, batch_size=obs.shape[:-1])
        with self._autocast(obs.device):
            dist_params = actor.get_dist_params(td)
        if self.rollout_dtype != torch.float32:
            dist_params = dist_params.apply(lambda x: x.float() if x.is_floating_point() else x)
        dist = actor.build_dist_from_params(dist_params)
        if with_log_prob:
            action, log_prob = rsample_and_log_prob(dist)
            return action, log_prob
        return dist.sample(), None

    def _q_values(
        self, obs: torch.Tensor, action: torch.Tensor, params: TensorDictBase
    ) -> torch.Tensor:
        """All members on all rows in one batched call: ``[R, O], [R, A] -> [M, R]`` (fp32)."""
        if self._mlp_plan is not None:
            compiled = None
            if self.compile and obs.device.type == "cuda" and not self.whole_step_graph:
                if self._compiled_q is None:
                    self._compiled_q = torch.compile(fused_mlp_ensemble, mode="reduce-overhead")
                compiled = self._compiled_q
            rows = self.q_chunk_rows
            if rows == "auto":
                rows = default_q_chunk_rows(obs.device)
            return fused_q_values(
                obs, action, params, self._mlp_plan, self.rollout_dtype, rows, compiled
            )
        td = TensorDict({self.obs_key: obs, self.action_key: action}, batch_size=obs.shape[:1])
        with self._autocast(obs.device):
            out = self._vmap_q(td, params)
        return out.get(self.q_value_key).squeeze(-1).float()

    def _model_step(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One dynamics step of ``[K, R]`` particles: next observation, reward, terminated.

        A :class:`DynamicsModel` runs on the tensors (:meth:`DynamicsModel.rollout_step`);
        any other dynamics module through a TensorDict.
        """
        with self._autocast(obs.device):
            if self._tensor_dynamics:
                return self.dynamics.rollout_step(obs, action)
            step_td = TensorDict(
                {self.obs_key: obs, self.action_key: action}, batch_size=obs.shape[:2]
            )
            step_td = self.dynamics(step_td)
        return (
            step_td.get(("next", self.obs_key)),
            step_td.get(("next", self.tensor_keys.reward)),
            step_td.get(("next", self.tensor_keys.terminated)).squeeze(-1),
        )

    # --------------------------------------------------------------- the target
    @torch.no_grad()
    def rollout_returns(
        self, next_obs: torch.Tensor, target_params: TensorDictBase | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The h-step samples from ``s'``: the eager method's, a plain actor without loading
        its parameters into the module (it reads them directly)."""
        if self._actor_plan is not None:
            return self._rollout_returns(next_obs, target_params)
        with self._actor_loaded():
            return self._rollout_returns(next_obs, target_params)

    def _rollout_returns(
        self, next_obs: torch.Tensor, target_params: TensorDictBase | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_params = self._qvalue_params(target_params)
        layers = self._actor_layers()
        first_action, log_prob = self._sample_action(next_obs, with_log_prob=True, layers=layers)
        returns, valid = model_returns(
            next_obs,
            first_action,
            step=self._model_step,
            sample=lambda obs: self._sample_action(obs, with_log_prob=False, layers=layers)[0],
            q_values=lambda obs, action: self._q_values(obs, action, q_params),
            horizon=self.horizon,
            particles=self.num_particles,
            gamma=self.gamma,
            sampling=self.sampling,
            termination=self.termination,
        )
        return returns, valid, log_prob

    def _target_function(self, device: torch.device) -> Callable[..., Any]:
        """:meth:`_target_tensors`, compiled with inductor with ``compile`` on a CPU or in a
        whole-step CUDA graph (:attr:`whole_step_graph`)."""
        whole = device.type == "cpu" or (device.type == "cuda" and self.whole_step_graph)
        if not self.compile or not whole or self._eager_only:
            return self._target_tensors
        if self._compiled_target is None and device.type == "cpu":
            compilers = (os.environ.get("CXX"), "g++", "c++", "clang++")
            if not any(shutil.which(name) for name in compilers if name):
                raise RuntimeError(
                    "compile=true on a CPU compiles the CBOP target with torch.compile "
                    "(inductor), which needs a C++ compiler; none was found (CXX, g++, c++, "
                    "clang++). Install one (e.g. apt-get install g++) or run with compile=false."
                )
        if self._compiled_target is None:
            # Mode "default": no CUDA graphs of inductor's own, so the step's capture holds
            # the kernels. Random draws stay eager ones (fallback_random): the eager numbers.
            self._compiled_target = torch.compile(
                self._target_tensors, dynamic=False, options={"fallback_random": True}
            )
        return self._compiled_target


class CBOPValueEstimator(EstimatorFastPaths, eager.CBOPValueEstimator):
    """:class:`cbop_torchrl.objectives.CBOPValueEstimator` with the fast paths.

    Built with the eager estimator's arguments plus :class:`~cbop_torchrl.accel.FastPaths`'s
    keywords (``fused_q``, ``q_chunk_rows``, ``compile``, ``rollout_dtype``,
    ``whole_step_graph``), or ``fast_paths=FastPaths(...)``; ``fused_q`` is on by default.
    """

    def __init__(self, *, fast_paths: FastPaths | None = None, **kwargs: Any) -> None:
        fast, kwargs = FastPaths.split(kwargs)
        if fast_paths is None:
            fast_paths = FastPaths(**fast)
        elif fast:
            raise TypeError(f"pass fast_paths= or its keywords, not both; got {sorted(fast)}.")
        super().__init__(**kwargs)
        self._init_fast_paths(fast_paths)


def accelerate_estimator(
    estimator: eager.CBOPValueEstimator, paths: FastPaths
) -> eager.CBOPValueEstimator:
    """``estimator`` with the fast ``paths``, in place (:func:`~cbop_torchrl.accel.accelerate`)."""
    estimator.__class__ = fast_class(
        type(estimator), EstimatorFastPaths, eager.CBOPValueEstimator, CBOPValueEstimator
    )
    estimator._init_fast_paths(paths)
    return estimator


__all__ = ["CBOPValueEstimator", "EstimatorFastPaths", "accelerate_estimator"]
