"""How the CBOP rollout calls its networks fast: the fused Q-ensemble and a plain actor.

The rollout (:mod:`cbop_torchrl.objectives.cbop_target`) calls the target Q-ensemble once
on every row and the actor once per step. When the networks are the plain MLPs that
:func:`~cbop_torchrl.modules.actor_critic.make_qvalue` and
:func:`~cbop_torchrl.modules.actor_critic.make_actor` build, the accelerated estimator
(:mod:`cbop_torchrl.accel.estimator`, ``fused_q``) runs the same operations without
modules or TensorDicts:

- the Q-ensemble: one ``baddbmm`` + in-place activation per layer over the stacked
  ``[M, ...]`` weights (:func:`fused_q_values`), in blocks of ``chunk_rows`` rows, or in
  one block through a ``torch.compile``'d function (CUDA graphs) on CUDA;
- the actor: one ``addmm`` (+ ReLU) per layer on weights cast and transposed once per
  rollout (:func:`actor_layers`, :func:`plain_actor_dist_params`).

Any other network runs as a module (``vmap`` over the Q parameters).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from cbop_torchrl.accel.fused_mlp import (
    MLPPlan,
    differentiable_relu,
    fused_mlp_ensemble,
    stack_mlp_weights,
)
from cbop_torchrl.modules.actor_critic import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    BoxTanhNormal,
    ClampedLogStdHead,
)

#: Rows per block of the fused Q-ensemble (``q_chunk_rows``): at M = 20 and width 256 a
#: block's fp32 activations are 20 x 8192 x 256 x 4 B = 168 MB (all 51k rows of the paper's
#: sizes: 1 GB). Blocks of this size run as fast as one block; much smaller ones make
#: smaller, slower GEMMs (docs/speed.md).
DEFAULT_Q_CHUNK_ROWS = 8192
#: Rows per block on CUDA: all 51,456 rows of the paper's sizes in one block (activations
#: up to M x 65,536 x width: 1.3 GB in bf16, 3.4 GB in fp32 at M = 50 and width 256, which
#: a training GPU holds), so the captured step launches one block's kernels, not seven.
DEFAULT_CUDA_Q_CHUNK_ROWS = 65536


def default_q_chunk_rows(device: torch.device) -> int:
    """``q_chunk_rows="auto"`` on ``device``: :data:`DEFAULT_CUDA_Q_CHUNK_ROWS` on CUDA,
    :data:`DEFAULT_Q_CHUNK_ROWS` elsewhere."""
    return DEFAULT_CUDA_Q_CHUNK_ROWS if device.type == "cuda" else DEFAULT_Q_CHUNK_ROWS


#: A plain actor's Linear layers, in order: the ``(weight, bias)`` keys of its parameters.
ActorPlan = list[tuple[tuple[str, ...], tuple[str, ...]]]
#: A plain actor's layers for one rollout: ``(weight^T [in, out], bias [out])``.
ActorLayers = list[tuple[torch.Tensor, torch.Tensor]]


def plain_actor_plan(actor: TensorDictModuleBase, obs_key: str) -> ActorPlan | None:
    """The Linear layers of :func:`~cbop_torchrl.modules.actor_critic.make_actor`'s actor, or None.

    Plain means: ``observation -> MLP (Linear, ReLU, ..., Linear) -> ClampedLogStdHead``
    and a :class:`~cbop_torchrl.modules.actor_critic.BoxTanhNormal` on ``[-1, 1]``. The
    rollout then samples its actions with one ``addmm`` (+ ReLU) per layer on weights cast
    and transposed once per rollout, the same operations ``F.linear`` and the distribution
    run, without a TensorDict per step.
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


def actor_layers(params: TensorDictBase, plan: ActorPlan, dtype: torch.dtype) -> ActorLayers:
    """A plain actor's layers as ``(weight^T [in, out], bias [out])`` in ``dtype``.

    Made once per rollout: the casts and transposes ``F.linear`` under autocast would make
    at every step.
    """
    layers = []
    for weight_key, bias_key in plan:
        weight, bias = params.get(weight_key), params.get(bias_key)
        if dtype != torch.float32:
            weight, bias = weight.to(dtype), bias.to(dtype)
        layers.append((weight.t(), bias))  # a transposed view, as F.linear passes it
    return layers


def addmm_relu(bias: torch.Tensor, hidden: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``relu(addmm(bias, hidden, weight_t))`` as one operation.

    ``torch._addmm_activation`` is private but long-standing (it backs the fused
    Linear + ReLU of PyTorch's own compiler): one dispatched operation instead of two, whose
    CUDA kernel applies the ReLU in the matmul's epilogue (cuBLASLt) and whose CPU kernel is
    ``addmm`` then an in-place ReLU, the same numbers bit for bit. It has no derivative:
    under autograd this is ``addmm`` then :func:`differentiable_relu`.
    """
    fused = getattr(torch, "_addmm_activation", None)
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight_t.requires_grad or bias.requires_grad
    )
    if fused is None or needs_grad:  # it has no derivative
        return differentiable_relu(torch.addmm(bias, hidden, weight_t))
    return fused(bias, hidden, weight_t)


def plain_actor_dist_params(
    obs: torch.Tensor, layers: ActorLayers, dtype: torch.dtype, cast: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``loc``, ``scale`` ``[R, A]`` of a plain actor on ``obs`` ``[*b, O]``.

    The operations of the actor module under the rollout's autocast: ``addmm`` per layer on
    the cast weights, ReLU between (:func:`addmm_relu`), then the head's split, clamp and exp
    in ``dtype``, cast to fp32 (the same numbers as the module). ``cast=False`` leaves them
    in ``dtype``, for a caller whose next operation takes them to fp32 itself (an operation
    with a float32 operand computes in float32, the same numbers without the two casts).
    """
    hidden = obs.reshape(-1, obs.shape[-1]) if obs.dim() != 2 else obs
    if dtype != torch.float32:
        hidden = hidden.to(dtype)
    last = len(layers) - 1
    for index, (weight_t, bias) in enumerate(layers):
        if index < last:
            hidden = addmm_relu(bias, hidden, weight_t)
        else:
            hidden = torch.addmm(bias, hidden, weight_t)
    loc, log_std = hidden.chunk(2, dim=-1)
    scale = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
    if cast and dtype != torch.float32:
        loc, scale = loc.float(), scale.float()
    return loc, scale


def fused_q_values(
    obs: torch.Tensor,
    action: torch.Tensor,
    params: TensorDictBase,
    plan: MLPPlan,
    dtype: torch.dtype,
    chunk_rows: int | None,
    compiled: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Every member of a plain Q-ensemble on every row: ``[R, O], [R, A] -> [M, R]`` (fp32).

    ``compiled``: a ``torch.compile``'d :func:`fused_mlp_ensemble`, run on all rows in one
    block (a GPU has the memory, and a single graph replays best); otherwise blocks of
    ``chunk_rows`` rows (``None``: one block). Results do not depend on the blocks.
    """
    layers = stack_mlp_weights(params, plan, dtype)
    inputs = torch.cat([obs, action], dim=-1)
    if compiled is not None:
        return compiled(inputs, layers, None)
    return fused_mlp_ensemble(inputs, layers, chunk_rows)


__all__ = [
    "DEFAULT_CUDA_Q_CHUNK_ROWS",
    "DEFAULT_Q_CHUNK_ROWS",
    "ActorLayers",
    "ActorPlan",
    "actor_layers",
    "addmm_relu",
    "default_q_chunk_rows",
    "fused_q_values",
    "plain_actor_dist_params",
    "plain_actor_plan",
]
