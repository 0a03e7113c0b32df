"""CBOP's value estimator: K-particle model rollouts, an M-member target Q, a Bayesian target.

:class:`CBOPValueEstimator` is a TorchRL ``ValueEstimatorBase``. Given a batch of
dataset transitions ``(s, a, r, s', terminated)`` it

1. samples ``a' ~ pi(.|s')`` once per transition (shared by the particles, so
   horizon 0 is exactly the model-free SAC bootstrap) and starts K particles at
   ``s_1 = s'``;
2. rolls them out H steps, particle k with dynamics elite k (TS-infinity): one
   batched dynamics call and one actor call per step for all particles;
3. evaluates the target Q-ensemble on every ``(s_{h+1}, a_{h+1})``, h = 0..H, in
   ONE vmapped call over the stacked ``[M, ...]`` parameters;
4. forms ``returns`` ``(N, H+1, K, M)`` with
   ``R_h[k, m] = sum_{t=1..h} gamma^(t-1) r_t[k] + gamma^h Q'_m(s_{h+1}[k], a_{h+1}[k])``,
   reduces it with :func:`gaussian_posterior` (or an ablation) and returns
   ``y = r + gamma (1 - terminated) (mu - psi sigma - alpha log pi(a'|s'))``.

Sampling (``sampling``): with ``"shared"`` (default) one set of K rollouts of
length H feeds every horizon, so the horizons' estimates are correlated, which
the posterior (paper eq. 6-8) treats as independent. With ``"independent"``
every horizon h >= 1 gets its own K rollouts of length h (``H (H+1) / 2``
dynamics steps per particle instead of H), which makes the horizons
conditionally independent as the posterior assumes. (The authors' code has
both, ``indep_sampling``; its README command, which reproduces the paper,
uses the shared one.)

Model termination: a particle whose predicted next state is terminal is absorbing
(no later reward, no bootstrap). With ``termination="zero_precision"`` (default,
as in the reference code) every horizon from the first step at which ANY
particle of a transition terminated also gets zero precision; with
``termination="absorb"`` only the absorbing rule applies. The precision mask
only enters the Bayesian modes (``lcb``/``map``).

The estimator owns no parameters: it reads the actor, the target Q parameters
and alpha from a loss (:meth:`CBOPValueEstimator.from_sac_loss`) or from the
objects given to the constructor, and keeps the dynamics model as a plain
reference. Registering it in a loss (``loss.make_value_estimator(estimator)``)
therefore adds nothing to the loss's ``state_dict`` or ``parameters()``; move
the dynamics model to the loss's device yourself.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives.value import ValueEstimatorBase

from cbop_torchrl._torchrl_compat import vmap_over_params
from cbop_torchrl.modules.actor_critic import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    BoxTanhNormal,
    ClampedLogStdHead,
)
from cbop_torchrl.modules.fused_mlp import (
    fused_mlp_ensemble,
    plain_mlp_plan,
    stack_mlp_weights,
)
from cbop_torchrl.objectives.posterior import (
    VAR_FLOOR,
    fixed_weight_moments,
    fixed_weights,
    gaussian_posterior,
    pooled_quantile,
)
from cbop_torchrl.objectives.rollout_dtype import (
    BF16_MIN_SPEEDUP,
    BF16_TOLERANCE,
    bf16_matmul_speedup,
    resolve_rollout_dtype,
)

MODES = ("lcb", "map", "fixed", "quantile")
FIXED_WEIGHTINGS = ("uniform", "lambda")
TERMINATIONS = ("zero_precision", "absorb")
SAMPLINGS = ("shared", "independent")

#: Rows per block of the fused Q-ensemble (see ``q_chunk_rows``): at M = 20 and width
#: 256 a block's fp32 activations are 20 x 8192 x 256 x 4 B = 168 MB (all 51k rows of the
#: paper's sizes: 1 GB). Measured on the 2-core CPU at the paper's sizes: 8192-row blocks
#: are as fast as one block; 2048 are 1.3x (fp32) to 2x (bf16) slower (smaller GEMMs).
DEFAULT_Q_CHUNK_ROWS = 8192


#: A plain actor's Linear layers, in order: the ``(weight, bias)`` keys of its parameters.
ActorPlan = list[tuple[tuple[str, ...], tuple[str, ...]]]


def plain_actor_plan(actor: TensorDictModuleBase, obs_key: str) -> ActorPlan | None:
    """The Linear layers of :func:`~cbop_torchrl.modules.actor_critic.make_actor`'s actor, or None.

    Plain means: ``observation -> MLP (Linear, ReLU, ..., Linear) -> ClampedLogStdHead``
    and a :class:`~cbop_torchrl.modules.actor_critic.BoxTanhNormal` on ``[-1, 1]``. The
    rollout then samples its actions with one ``addmm`` (+ ReLU) per layer on weights cast
    and transposed once per rollout (:meth:`CBOPValueEstimator._plain_actor_sample`), the
    same operations ``F.linear`` and the distribution run, without a TensorDict per step.
    """
    modules = getattr(actor, "module", None)
    if not isinstance(modules, torch.nn.ModuleList) or len(modules) != 2:
        return None
    params_module, dist_module = modules
    if list(getattr(params_module, "in_keys", [])) != [obs_key]:
        return None
    if list(getattr(params_module, "out_keys", [])) != ["loc", "scale"]:
        return None
    if getattr(dist_module, "distribution_class", None) is not BoxTanhNormal:
        return None
    kwargs = dict(getattr(dist_module, "distribution_kwargs", {}) or {})
    if (float(kwargs.get("low", -1.0)), float(kwargs.get("high", 1.0))) != (-1.0, 1.0):
        return None
    body = getattr(params_module, "module", None)
    if not isinstance(body, torch.nn.Sequential) or len(body) != 2:
        return None
    mlp, head = body
    if type(head) is not ClampedLogStdHead or not isinstance(mlp, torch.nn.Sequential):
        return None
    children = list(mlp.named_children())
    kinds = [type(child) for _, child in children]
    if not kinds or len(kinds) % 2 == 0:
        return None
    if any(kind is not torch.nn.Linear for kind in kinds[::2]):
        return None
    if any(kind is not torch.nn.ReLU for kind in kinds[1::2]):
        return None
    if any(child.bias is None for _, child in children[::2]):
        return None
    prefix = ("module", "0", "module", "0")
    return [((*prefix, name, "weight"), (*prefix, name, "bias")) for name, _ in children[::2]]


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
        gamma: discount.
        horizon: rollout length H (``0`` gives the model-free target).
        psi: LCB coefficient (``lcb`` and ``fixed`` modes).
        mode: ``"lcb"`` (CBOP), ``"map"`` (STEVE: posterior mean), ``"fixed"``
            (fixed horizon weights, then the LCB of the K*M weighted samples)
            or ``"quantile"`` (DiMVE: a quantile of all pooled samples).
        fixed_weighting: ``"uniform"`` or ``"lambda"`` (``mode="fixed"``).
        lmbda: lambda of the lambda-weighting.
        quantile: the DiMVE quantile (``mode="quantile"``).
        alpha: entropy coefficient: a float, a scalar tensor or a zero-argument
            callable returning one (read at every call).
        termination: ``"zero_precision"`` (default) or ``"absorb"``, see the module doc.
        sampling: ``"shared"`` (default) or ``"independent"`` rollouts per horizon,
            see the module doc.
        rollout_dtype: ``torch.float32`` (default) or ``torch.bfloat16``: run the
            actor, dynamics and Q matmuls under ``torch.autocast``; the action
            distribution, returns and posterior stay in float32.
        qvalue_params: ``[M, ...]`` parameters for a single ``qvalue_network``.
        actor_params: parameters to load into ``actor_network`` for the call
            (``None``: its own).
        num_particles: K; defaults to ``dynamics.num_elites``.
        seed: if given, every call draws its randomness (actions, model noise
            without an explicit generator) from a private stream seeded with
            it, leaving the global RNG untouched: two estimators with the same
            seed produce the same targets whatever else consumed random numbers.
        obs_key, action_key: observation/action keys of the actor, Q and dynamics.
        q_value_key: the Q-network's output key.
        var_floor: floor of the per-horizon variance (see :data:`VAR_FLOOR`).
        deactivate_vmap: run the Q-ensemble with a Python loop (debugging only).
        fused_q: when the Q-network is a plain MLP on ``cat(observation, action)``
            (a ``ValueOperator`` over Linear/ReLU/Tanh/SiLU layers, as
            :func:`make_qvalue` builds), evaluate the ensemble with one fused
            ``baddbmm`` + in-place activation per layer
            (:mod:`cbop_torchrl.modules.fused_mlp`) instead of ``vmap`` (about
            1.5x faster in fp32: no separate bias and activation passes over
            the ``[M, rows, 256]`` activations; bf16 casts the stacked weights
            once per call). Any other Q-network uses ``vmap``.
        q_chunk_rows: rows per block of the fused Q-ensemble (``None``: all at
            once). Bounds its activations to ``M x q_chunk_rows x width``
            (at the paper's sizes all 51k rows at once need 1 GB per layer in
            fp32). Results do not depend on it.
        compile: on CUDA, run the fused Q-ensemble through ``torch.compile``
            with ``mode="reduce-overhead"`` (CUDA graphs: the per-layer kernels
            are replayed without launch overhead). On CPU, compile the whole
            target's tensor part (rollout, returns, posterior; one graph) with
            inductor, static shapes: the matmuls stay the same, the small
            elementwise ops between them fuse. It needs a C++ compiler, costs
            tens of CPU seconds at the first call (seconds once inductor's cache
            holds the graph) and recompiles for a new batch size or
            ``rollout_dtype``; random draws are eager ones (``fallback_random``),
            so targets equal the eager ones up to float rounding
            (``scripts/bench.py --compile-cpu`` measures it).
    """

    def __init__(
        self,
        *,
        actor_network: TensorDictModuleBase,
        qvalue_network: TensorDictModuleBase | Sequence[TensorDictModuleBase],
        dynamics: TensorDictModuleBase,
        gamma: float = 0.99,
        horizon: int = 10,
        psi: float = 1.0,
        mode: str = "lcb",
        fixed_weighting: str = "uniform",
        lmbda: float = 0.9,
        quantile: float = 0.3085,
        alpha: float | torch.Tensor | Callable[[], torch.Tensor] = 0.0,
        termination: str = "zero_precision",
        sampling: str = "shared",
        rollout_dtype: torch.dtype | str = torch.float32,
        qvalue_params: TensorDictBase | None = None,
        actor_params: TensorDictBase | None = None,
        num_particles: int | None = None,
        seed: int | None = None,
        obs_key: str = "observation",
        action_key: str = "action",
        q_value_key: str = "state_action_value",
        var_floor: float = VAR_FLOOR,
        deactivate_vmap: bool = False,
        fused_q: bool = True,
        q_chunk_rows: int | None = DEFAULT_Q_CHUNK_ROWS,
        compile: bool = False,
    ) -> None:
        super().__init__(value_network=None, deactivate_vmap=deactivate_vmap)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}.")
        if termination not in TERMINATIONS:
            raise ValueError(f"termination must be one of {TERMINATIONS}; got {termination!r}.")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}; got {sampling!r}.")
        if fixed_weighting not in FIXED_WEIGHTINGS:
            raise ValueError(
                f"fixed_weighting must be one of {FIXED_WEIGHTINGS}; got {fixed_weighting!r}."
            )
        if int(horizon) != horizon or horizon < 0:
            raise ValueError(f"horizon must be a non-negative integer; got {horizon!r}.")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1]; got {gamma}.")
        if q_chunk_rows is not None and (int(q_chunk_rows) != q_chunk_rows or q_chunk_rows < 1):
            raise ValueError(
                f"q_chunk_rows must be a positive integer or None (no chunking); got "
                f"{q_chunk_rows!r}."
            )
        if num_particles is None:
            num_particles = getattr(dynamics, "num_elites", None)
            if num_particles is None:
                raise ValueError(
                    "num_particles was not given and the dynamics model has no `num_elites`; "
                    "pass num_particles=K (particle k is propagated by elite k)."
                )
        self.gamma = float(gamma)
        self.horizon = int(horizon)
        self.psi = float(psi)
        self.mode = mode
        self.termination = termination
        self.sampling = sampling
        self.quantile = float(quantile)
        self.num_particles = int(num_particles)
        self.rollout_dtype = resolve_rollout_dtype(rollout_dtype)
        self.obs_key, self.action_key, self.q_value_key = obs_key, action_key, q_value_key
        self.var_floor = float(var_floor)
        self._fixed_weights = (
            fixed_weights(self.horizon, None if fixed_weighting == "uniform" else lmbda)
            if mode == "fixed"
            else None
        )
        if mode == "quantile":
            pooled_quantile(torch.zeros(1, 1, 1, 1), self.quantile)  # validates the range

        # Everything below is referenced, not registered: see the module doc.
        if isinstance(qvalue_network, (list, tuple)):
            if qvalue_params is not None:
                raise ValueError("Pass either a list of Q-networks or qvalue_params, not both.")
            qvalue_params = TensorDict.from_modules(*qvalue_network, as_module=True)
            qvalue_network = qvalue_network[0]
        elif qvalue_params is None:
            raise ValueError(
                "qvalue_network is a single network: pass its stacked [M, ...] parameters as "
                "qvalue_params, or pass the ensemble as a list of networks."
            )
        self.__dict__["actor_network"] = actor_network
        self.__dict__["qvalue_network"] = qvalue_network
        self.__dict__["dynamics"] = dynamics
        self.__dict__["_own_sources"] = {
            "actor_params": actor_params,
            "qvalue_params": qvalue_params,
            "alpha": alpha,
        }
        self.__dict__["_loss"] = None
        self._vmap_q = vmap_over_params(
            qvalue_network, (None, 0), self.vmap_randomness, loop=deactivate_vmap
        )
        self._mlp_plan = plain_mlp_plan(qvalue_network, obs_key, action_key, q_value_key)
        if not fused_q or deactivate_vmap:
            self._mlp_plan = None
        self._actor_plan = plain_actor_plan(actor_network, obs_key) if fused_q else None
        self.q_chunk_rows = None if q_chunk_rows is None else int(q_chunk_rows)
        self.compile = bool(compile)
        self._compiled_q: Callable[..., torch.Tensor] | None = None
        self._compiled_target: Callable[..., Any] | None = None
        self._eager_only = False  # set while measure_bf16_error runs (no compile per dtype)
        self._seed_stream = None if seed is None else random.Random(int(seed))
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
            **kwargs: the other constructor arguments (``gamma``, ``horizon``, ``psi``, ...).
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
        if loss is not None:  # SACLoss's alpha from its public log_alpha and bounds
            log_alpha = loss.log_alpha.detach()
            if loss.min_log_alpha is not None or loss.max_log_alpha is not None:
                log_alpha = log_alpha.clamp(loss.min_log_alpha, loss.max_log_alpha)
            return log_alpha.exp()
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

    # ------------------------------------------------------- rollout precision
    @torch.no_grad()
    def measure_bf16_error(self, tensordict: TensorDictBase, seed: int = 0) -> float:
        """``mean|y_bf16 - y_fp32| / std(y_fp32)`` on ``tensordict``, same randomness for both.

        The global RNG is forked (left untouched); ``rollout_dtype`` is restored.
        """
        previous, previous_eager = self.rollout_dtype, self._eager_only
        self._eager_only = True  # one-off calls in two dtypes: not worth two compilations
        targets = []
        try:
            for dtype in (torch.float32, torch.bfloat16):
                self.rollout_dtype = dtype
                device = tensordict.device or torch.device("cpu")
                devices = [device] if device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    targets.append(self.compute_target(tensordict)[0])
        finally:
            self.rollout_dtype, self._eager_only = previous, previous_eager
        y32, y16 = targets
        return float((y16 - y32).abs().mean() / y32.std().clamp_min(1e-12))

    def select_rollout_dtype(
        self, tensordict: TensorDictBase, tolerance: float = BF16_TOLERANCE
    ) -> dict[str, Any]:
        """Sets ``rollout_dtype`` to bf16 if it is fast here and accurate on this data, else fp32.

        bf16 is chosen when the device runs bf16 matmuls at least
        :data:`~cbop_torchrl.objectives.rollout_dtype.BF16_MIN_SPEEDUP` x faster than fp32
        (:func:`~cbop_torchrl.objectives.rollout_dtype.bf16_matmul_speedup`)
        AND the targets on ``tensordict`` (a few batches of the dataset, with the
        current actor and Q-ensemble) move by at most ``tolerance`` x their std
        (:meth:`measure_bf16_error`). Returns what was chosen and why.
        """
        device = tensordict.device or torch.device("cpu")
        speedup = bf16_matmul_speedup(device)
        error = self.measure_bf16_error(tensordict)
        fast, accurate = speedup >= BF16_MIN_SPEEDUP, error <= tolerance
        self.rollout_dtype = torch.bfloat16 if fast and accurate else torch.float32
        return {
            "rollout_dtype": "bfloat16" if self.rollout_dtype == torch.bfloat16 else "float32",
            "bf16_matmul_speedup": speedup,
            "bf16_target_rel_error": error,
            "bf16_tolerance": tolerance,
            "reason": (
                "bf16 matmuls are fast here and the targets move little"
                if fast and accurate
                else ("bf16 matmuls are not fast here" if not fast else "bf16 moves the targets")
            ),
        }

    # --------------------------------------------------------------- the maths
    def _rng_context(self, device: torch.device):
        if self._seed_stream is None:
            return contextlib.nullcontext()
        seed = self._seed_stream.getrandbits(62)  # Python's RNG: no tensor read back
        devices = [device] if device.type == "cuda" else []
        stack = contextlib.ExitStack()
        stack.enter_context(torch.random.fork_rng(devices=devices))
        torch.manual_seed(seed)
        return stack

    def _autocast(self, device: torch.device):
        if self.rollout_dtype == torch.float32:
            return contextlib.nullcontext()
        # Inside a CUDA graph capture autocast must not cache its weight casts (PyTorch's
        # CUDA-graph notes): the cached copies would outlive the capture's allocations.
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return torch.autocast(
            device_type=device.type, dtype=self.rollout_dtype, cache_enabled=not capturing
        )

    def _actor_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """A plain actor's layers as ``(weight^T [in, out], bias [out])`` in the rollout dtype.

        Made once per rollout (the casts and transposes ``F.linear`` under autocast would
        make at every step); None for another actor (it then runs as a module).
        """
        if self._actor_plan is None:
            return None
        params = self._actor_params()
        if params is None:
            params = TensorDict.from_module(self.actor_network)
        dtype = self.rollout_dtype
        layers = []
        for weight_key, bias_key in self._actor_plan:
            weight, bias = params.get(weight_key), params.get(bias_key)
            if dtype != torch.float32:
                weight, bias = weight.to(dtype), bias.to(dtype)
            layers.append((weight.t(), bias))  # a transposed view, as F.linear passes it
        return layers

    def _plain_actor_params(
        self, obs: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``loc``, ``scale`` ``[*b, A]`` (fp32) of a plain actor on ``obs`` ``[*b, O]``.

        The operations of the actor module under the rollout's autocast: ``addmm`` per
        layer on the cast weights, ReLU between, then the head's split, clamp and exp in
        the rollout dtype, cast to fp32 (the same numbers as :meth:`_sample_action`'s
        module path).
        """
        hidden = obs.reshape(-1, obs.shape[-1])
        if self.rollout_dtype != torch.float32:
            hidden = hidden.to(self.rollout_dtype)
        last = len(layers) - 1
        for index, (weight_t, bias) in enumerate(layers):
            hidden = torch.addmm(bias, hidden, weight_t)
            if index < last:
                hidden = torch.relu(hidden)
        loc, log_std = hidden.chunk(2, dim=-1)
        scale = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        if self.rollout_dtype != torch.float32:
            loc, scale = loc.float(), scale.float()
        return loc, scale

    def _sample_action(
        self,
        obs: torch.Tensor,
        with_log_prob: bool,
        layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``a ~ pi(.|obs)`` ``[*b, A]`` (and ``log pi`` ``[*b]``); dist maths in fp32.

        With ``layers`` (:meth:`_actor_layers`, a plain actor) the actor's operations run
        on them directly; otherwise the actor runs as it is: callers load the actor
        parameters first (:meth:`_actor_loaded`, once per rollout rather than once per step).
        """
        actor = self.actor_network
        if layers is not None:
            loc, scale = self._plain_actor_params(obs, layers)
            if not with_log_prob:
                # BoxTanhNormal's draw on [-1, 1]: tanh(loc + eps * scale), eps ~ N(0, 1).
                eps = torch.randn(loc.shape, dtype=loc.dtype, device=loc.device)
                action = torch.tanh(loc + eps * scale)
                return action.reshape(*obs.shape[:-1], action.shape[-1]), None
            batch = obs.shape[:-1]
            dist_params = TensorDict(
                {"loc": loc.reshape(*batch, -1), "scale": scale.reshape(*batch, -1)},
                batch_size=batch,
            )
        else:
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
            layers = stack_mlp_weights(params, self._mlp_plan, self.rollout_dtype)
            inputs = torch.cat([obs, action], dim=-1)
            if self.compile and obs.device.type == "cuda":
                if self._compiled_q is None:
                    self._compiled_q = torch.compile(fused_mlp_ensemble, mode="reduce-overhead")
                # One block: a GPU has the memory, and a single graph replays best.
                return self._compiled_q(inputs, layers, None)
            return fused_mlp_ensemble(inputs, layers, self.q_chunk_rows)
        td = TensorDict({self.obs_key: obs, self.action_key: action}, batch_size=obs.shape[:1])
        with self._autocast(obs.device):
            out = self._vmap_q(td, params)
        return out.get(self.q_value_key).squeeze(-1).float()

    def _actor_loaded(self):
        """A context in which ``actor_network`` runs with the parameters to use (loss's or own)."""
        params = self._actor_params()
        if params is None:
            return contextlib.nullcontext()
        return params.to_module(self.actor_network)

    @torch.no_grad()
    def rollout_returns(
        self, next_obs: torch.Tensor, target_params: TensorDictBase | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The h-step samples from ``s'``.

        Args:
            next_obs: ``[N, O]`` the dataset's next observations ``s'``.
            target_params: optional ``[M, ...]`` Q parameters overriding the target ones.

        Returns:
            ``returns`` ``(N, H+1, K, M)``, ``valid`` bool ``(N, H+1)`` (horizons
            before any particle's termination) and ``log pi(a'|s')`` ``[N]``.
        """
        # Loading a loss's (locked) parameters into the actor costs about a millisecond on
        # a CPU: once for the rollout's H + 1 actor passes.
        if self._actor_plan is not None:  # the plain actor reads its parameters directly
            return self._rollout_returns(next_obs, target_params)
        with self._actor_loaded():
            return self._rollout_returns(next_obs, target_params)

    def _rollout_returns(
        self, next_obs: torch.Tensor, target_params: TensorDictBase | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        H, K = self.horizon, self.num_particles
        N = next_obs.shape[0]
        gamma = self.gamma
        device = next_obs.device
        q_params = self._qvalue_params(target_params)

        layers = self._actor_layers()
        first_action, log_prob = self._sample_action(next_obs, with_log_prob=True, layers=layers)
        if self.sampling == "independent" and H > 0:
            returns = self._independent_returns(next_obs, first_action, q_params, layers)
            return returns + (log_prob,)
        obs = next_obs.unsqueeze(0).expand(K, N, next_obs.shape[-1])  # a view: s_1 = s'
        action = first_action.unsqueeze(0).expand(K, *first_action.shape)
        alive = torch.ones(K, N, dtype=torch.bool, device=device)
        q_obs, q_action, rewards, alive_after = [], [], [], []
        for _ in range(H):
            step_td = TensorDict({self.obs_key: obs, self.action_key: action}, batch_size=[K, N])
            with self._autocast(device):
                step_td = self.dynamics(step_td)
            next_obs_k = step_td.get(("next", self.obs_key)).float()
            reward = step_td.get(("next", self.tensor_keys.reward)).float().squeeze(-1)
            terminated = step_td.get(("next", self.tensor_keys.terminated)).squeeze(-1)
            # Absorbing: no reward once terminated; the terminal step's reward counts.
            rewards.append(torch.where(alive, reward, torch.zeros_like(reward)))
            alive = alive & ~terminated.bool()
            alive_after.append(alive)
            # A terminated particle stays at its last live state (as the authors freeze
            # terminated rollouts): its later rows are masked, and the model never sees a
            # terminal (possibly non-finite or out-of-range) state.
            obs = torch.where(alive.unsqueeze(-1), next_obs_k, obs)
            action, _ = self._sample_action(obs, with_log_prob=False, layers=layers)
            q_obs.append(obs)
            q_action.append(action)

        # One Q call for every horizon: rows [N] (h = 0) then [H, K, N] (h >= 1).
        rows_obs = torch.cat([next_obs, *(o.reshape(K * N, -1) for o in q_obs)])
        rows_action = torch.cat([first_action, *(a.reshape(K * N, -1) for a in q_action)])
        q = self._q_values(rows_obs, rows_action, q_params)  # [M, N + H*K*N]
        M = q.shape[0]
        q0 = q[:, :N]  # [M, N]
        returns_0 = q0.t()[:, None, None, :].expand(N, 1, K, M)
        if H == 0:
            valid = torch.ones(N, 1, dtype=torch.bool, device=device)
            return returns_0.contiguous(), valid, log_prob

        q_h = q[:, N:].reshape(M, H, K, N)
        reward_h = torch.stack(rewards)  # [H, K, N]
        discounts = gamma ** torch.arange(H, device=device, dtype=reward_h.dtype)  # gamma^(h-1)
        partial = torch.cumsum(reward_h * discounts[:, None, None], dim=0)
        alive_h = torch.stack(alive_after)  # [H, K, N]
        # gamma^h Q where the particle is alive; a where, not a 0 x Q product, so a
        # terminated particle's Q (never used) cannot turn the sum into NaN.
        bootstrap = torch.where(alive_h, gamma * discounts[:, None, None] * q_h, 0.0)
        returns_h = partial + bootstrap  # [M, H, K, N]
        returns = torch.cat([returns_0, returns_h.permute(3, 1, 2, 0)], dim=1)
        valid = torch.cat(
            [torch.ones(1, N, dtype=torch.bool, device=device), alive_h.all(dim=1)]
        ).t()
        if self.termination == "absorb":
            valid = torch.ones_like(valid)
        return returns, valid, log_prob

    def _independent_returns(
        self,
        next_obs: torch.Tensor,
        first_action: torch.Tensor,
        q_params: TensorDictBase,
        layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``returns`` ``(N, H+1, K, M)`` and ``valid`` ``(N, H+1)`` with fresh rollouts per h.

        Horizon h >= 1 has its own K particles, all starting at ``(s', a')``
        (the same ``a'`` as horizon 0). The groups still running at step t are
        those with h >= t, so step t propagates ``[K, (H - t + 1) * N]`` rows;
        the group with h = t is then complete and leaves the batch.
        """
        H, K = self.horizon, self.num_particles
        N, obs_dim = next_obs.shape
        gamma, device = self.gamma, next_obs.device
        obs = next_obs.expand(K, H, N, obs_dim)  # [K, G, N, O], group g is horizon g + 1
        action = first_action.expand(K, H, *first_action.shape)
        alive = torch.ones(K, H, N, dtype=torch.bool, device=device)
        partial = torch.zeros(K, H, N, device=device)
        done_obs, done_action, done_partial, done_alive, done_valid = [], [], [], [], []
        valid_group = torch.ones(H, N, dtype=torch.bool, device=device)
        for t in range(H):  # model step t + 1; groups with horizon >= t + 1 remain
            groups = H - t
            step_td = TensorDict(
                {
                    self.obs_key: obs.reshape(K, groups * N, obs_dim),
                    self.action_key: action.reshape(K, groups * N, -1),
                },
                batch_size=[K, groups * N],
            )
            with self._autocast(device):
                step_td = self.dynamics(step_td)
            stepped = step_td.get(("next", self.obs_key)).float().reshape(K, groups, N, obs_dim)
            reward = step_td.get(("next", self.tensor_keys.reward)).float().reshape(K, groups, N)
            terminated = step_td.get(("next", self.tensor_keys.terminated)).reshape(K, groups, N)
            partial = partial + gamma**t * torch.where(alive, reward, torch.zeros_like(reward))
            alive = alive & ~terminated.bool()
            # Terminated particles stay at their last live state (see _rollout_returns).
            obs = torch.where(alive.unsqueeze(-1), stepped, obs)
            valid_group = valid_group & alive.all(dim=0)
            action, _ = self._sample_action(obs, with_log_prob=False, layers=layers)
            # The first remaining group has horizon t + 1: it is complete.
            done_obs.append(obs[:, 0])
            done_action.append(action[:, 0])
            done_partial.append(partial[:, 0])
            done_alive.append(alive[:, 0])
            done_valid.append(valid_group[0])
            obs, action = obs[:, 1:], action[:, 1:]
            partial, alive, valid_group = partial[:, 1:], alive[:, 1:], valid_group[1:]

        rows_obs = torch.cat([next_obs, *(o.reshape(K * N, -1) for o in done_obs)])
        rows_action = torch.cat([first_action, *(a.reshape(K * N, -1) for a in done_action)])
        q = self._q_values(rows_obs, rows_action, q_params)  # [M, N + H*K*N]
        M = q.shape[0]
        returns_0 = q[:, :N].t()[:, None, None, :].expand(N, 1, K, M)
        q_h = q[:, N:].reshape(M, H, K, N)
        discount_h = gamma ** torch.arange(1, H + 1, device=device, dtype=q.dtype)  # gamma^h
        bootstrap = torch.where(torch.stack(done_alive), discount_h[:, None, None] * q_h, 0.0)
        returns_h = torch.stack(done_partial) + bootstrap  # [M, H, K, N]
        returns = torch.cat([returns_0, returns_h.permute(3, 1, 2, 0)], dim=1)
        valid = torch.cat(
            [
                torch.ones(1, N, dtype=torch.bool, device=device),
                *(v.unsqueeze(0) for v in done_valid),
            ]
        ).t()
        if self.termination == "absorb":
            valid = torch.ones_like(valid)
        return returns, valid

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
        """:meth:`_target_tensors`, compiled with inductor with ``compile`` on a CPU."""
        if not self.compile or device.type != "cpu" or self._eager_only:
            return self._target_tensors
        if self._compiled_target is None:
            compilers = (os.environ.get("CXX"), "g++", "c++", "clang++")
            if not any(shutil.which(name) for name in compilers if name):
                raise RuntimeError(
                    "compile=true on a CPU compiles the CBOP target with torch.compile "
                    "(inductor), which needs a C++ compiler; none was found (CXX, g++, c++, "
                    "clang++). Install one (e.g. apt-get install g++) or run with compile=false."
                )
            self._compiled_target = torch.compile(
                self._target_tensors, dynamic=False, options={"fallback_random": True}
            )
        return self._compiled_target

    def _target_tensors(
        self,
        next_obs: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        target_params: TensorDictBase | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``y`` ``[N]`` and the diagnostics from ``s'`` ``[N, O]``, ``r``, ``terminated`` ``[N]``.

        The target's tensor part, without TensorDict inputs or outputs: what a
        ``torch.compile`` of the target would wrap (``scripts/bench.py --compile-cpu``).
        """
        returns, valid, log_prob = self.rollout_returns(next_obs, target_params)
        post = gaussian_posterior(returns, valid, self.var_floor)
        sigma = post.var.sqrt()
        if self.mode == "lcb":
            value = post.mean - self.psi * sigma
        elif self.mode == "map":
            value = post.mean
        elif self.mode == "fixed":
            if self._fixed_weights.device != returns.device:  # moved once, not per call
                self._fixed_weights = self._fixed_weights.to(returns.device)
            weights = self._fixed_weights
            mean, var = fixed_weight_moments(returns, weights)
            value = mean - self.psi * var.sqrt()
        else:
            value = pooled_quantile(returns, self.quantile)
        alpha = torch.as_tensor(self._alpha(), dtype=value.dtype, device=value.device)
        not_terminal = 1.0 - terminated.to(value.dtype)
        target = reward + self.gamma * not_terminal * (value - alpha * log_prob.float())

        horizons = torch.arange(self.horizon + 1, device=value.device, dtype=value.dtype)
        total_var = post.var_value + post.var_model
        diagnostics = {
            "weights": post.weights.mean(0),
            "expected_horizon": (post.weights * horizons).sum(-1).mean(),
            "posterior_std": sigma.mean(),
            "value_var_share": (post.var_value / total_var.clamp_min(1e-12)).mean(0),
            "valid_fraction": valid.float().mean(0),
            "target_mean": target.mean(),
        }
        return target, diagnostics
