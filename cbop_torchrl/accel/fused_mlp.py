"""An ensemble of M plain MLPs run as one batched matmul per layer, on stacked parameters.

The Q-ensemble (:func:`~cbop_torchrl.modules.actor_critic.make_qvalue_ensemble`)
is M TorchRL ``ValueOperator``s over ``nn.Sequential(Linear, act, ..., Linear)``
(``Linear, LayerNorm, act, ...`` with ``layer_norm=True``) whose parameters
``SACLoss`` stacks into one ``[M, ...]`` TensorDict. Instead of ``torch.vmap``
over the members' modules, these helpers read the network's layer sequence
once (:func:`plain_mlp_plan`) and run every member at once with one
``baddbmm`` per Linear layer (bias fused), and a LayerNorm as one
``layer_norm`` over all members followed by each member's affine: the same
maths as ``vmap`` over the members' modules, fewer passes over the activations.

- :func:`stack_mlp_weights` + :func:`fused_mlp_ensemble`: for the accelerated CBOP
  estimator's rollouts (:mod:`cbop_torchrl.accel.estimator`, no gradient): weights cast
  (bf16) and transposed once per call, activations in place, rows in bounded blocks.
- :func:`stacked_mlp_forward`: differentiable (the accelerated CBOP loss's critic, EDAC
  and actor passes, :mod:`cbop_torchrl.accel.loss`).

Shapes: M members, R rows, ``in`` the input width (observation + action).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn


class LayerNormSpec(NamedTuple):
    """A plan's ``nn.LayerNorm`` over the last dimension (``("norm", LayerNormSpec)``)."""

    name: str
    """The child's name: its parameters are ``("module", name, "weight" | "bias")`` ``[M, W]``."""
    width: int
    """``W``, its ``normalized_shape`` (one dimension)."""
    eps: float
    """The module's ``eps``."""
    weight: bool
    """Whether it has an elementwise scale (``elementwise_affine``)."""
    bias: bool
    """Whether it has an elementwise shift."""


MLPPlan: TypeAlias = list[tuple[str, Any]]
"""A network's layers in order: ``("linear", child name)``, ``("norm", LayerNormSpec)`` or
``("act", activation fn)``."""
StackedMLPLayers: TypeAlias = list[
    tuple[torch.Tensor, torch.Tensor] | Callable[[torch.Tensor], torch.Tensor]
]
"""A plan with each Linear as ``(weight [M, in, out], bias [M, 1, out])``, each LayerNorm as a
callable on ``[M, rows, W]`` (:func:`member_layer_norm` with the members' affine), activations
as is."""

_INPLACE_ACTIVATIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: torch.relu_,
    nn.Tanh: torch.tanh_,
    nn.SiLU: lambda x: F.silu(x, inplace=True),
}


def differentiable_relu(hidden: torch.Tensor) -> torch.Tensor:
    """``relu(hidden)`` as ``threshold(hidden, 0, 0)``: the same values and gradients.

    Autograd saves ``relu``'s output, and a saved output costs a ``detach`` when it is
    saved and another when the backward reads it; ``threshold`` saves its input, which
    costs nothing: two operations fewer per ReLU in a step (four under EDAC's double
    backward), on the host and in a CUDA graph.
    """
    return F.threshold(hidden, 0.0, 0.0)


#: The same activations out of place, for paths that autograd differentiates.
_ACTIVATIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: differentiable_relu,
    nn.Tanh: torch.tanh,
    nn.SiLU: F.silu,
}


def member_layer_norm(
    hidden: torch.Tensor,
    width: int,
    eps: float,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    inplace: bool = False,
) -> torch.Tensor:
    """LayerNorm of ``[M, rows, W]`` over ``W``, then member m's affine: ``[M, rows, W]``.

    Args:
        hidden: ``[M, rows, W]`` (member m's rows in ``hidden[m]``).
        width: ``W``.
        eps: the LayerNorm's ``eps``.
        weight, bias: the members' scale and shift ``[M, 1, W]``, or None (no affine).
        inplace: apply the affine in place on the normalised tensor (a fresh one, so
            ``hidden`` itself is never written); not under autograd.

    The normalisation is one ``F.layer_norm`` over all members (its statistics
    accumulate in float32 for bf16 input, the output keeps ``hidden``'s dtype);
    the per-member affine is one ``addcmul``: the same maths as each member's
    ``nn.LayerNorm``.
    """
    hidden = F.layer_norm(hidden, (width,), eps=eps)
    if weight is not None and bias is not None:
        if inplace:
            return torch.addcmul(bias, hidden, weight, out=hidden)
        return torch.addcmul(bias, hidden, weight)
    if weight is not None:
        return hidden.mul_(weight) if inplace else hidden * weight
    if bias is not None:
        return hidden.add_(bias) if inplace else hidden + bias
    return hidden


def _rollout_layer_norm(
    hidden: torch.Tensor,
    width: int,
    eps: float,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`member_layer_norm`, its affine in place outside autograd (the rollout)."""
    return member_layer_norm(hidden, width, eps, weight, bias, inplace=not torch.is_grad_enabled())


def plain_mlp_plan(
    qvalue_network: TensorDictModuleBase,
    obs_key: str,
    action_key: str,
    q_value_key: str,
    inplace: bool = True,
) -> MLPPlan | None:
    """``[("linear", name) | ("norm", LayerNormSpec) | ("act", fn), ...]``, or None.

    None unless the network is a plain MLP. Plain means: reads ``[obs_key,
    action_key]`` (concatenated in that order, as TorchRL's ``MLP`` does),
    writes ``[q_value_key]``, and its ``module`` is an ``nn.Sequential`` of
    ``nn.Linear`` (with bias), ``nn.LayerNorm`` over the last dimension
    (:class:`LayerNormSpec`: the child's name, width, ``eps``, affine or not)
    and ReLU/Tanh/SiLU layers only, first and last a Linear.
    The activations run in place unless ``inplace=False`` (under autograd).
    """
    activations = _INPLACE_ACTIVATIONS if inplace else _ACTIVATIONS
    if list(getattr(qvalue_network, "in_keys", [])) != [obs_key, action_key]:
        return None
    if list(getattr(qvalue_network, "out_keys", [])) != [q_value_key]:
        return None
    module = getattr(qvalue_network, "module", None)
    if not isinstance(module, nn.Sequential) or len(module) == 0:
        return None
    plan: MLPPlan = []
    for name, child in module.named_children():
        if type(child) is nn.Linear and child.bias is not None:
            plan.append(("linear", name))
        elif type(child) is nn.LayerNorm and len(child.normalized_shape) == 1:
            spec = LayerNormSpec(
                name,
                int(child.normalized_shape[0]),
                float(child.eps),
                child.weight is not None,
                child.bias is not None,
            )
            plan.append(("norm", spec))
        elif type(child) in activations:
            plan.append(("act", activations[type(child)]))
        else:
            return None
    if plan[0][0] != "linear" or plan[-1][0] != "linear":
        return None
    return plan


def stack_mlp_weights(
    params: TensorDictBase, plan: MLPPlan, dtype: torch.dtype
) -> StackedMLPLayers:
    """The plan with its Linear layers as ``(weight [M, in, out], bias [M, 1, out])`` in ``dtype``.

    Args:
        params: the members' stacked parameters, ``("module", name, "weight")``
            ``[M, out, in]`` and ``("module", name, "bias")`` ``[M, out]`` for
            each Linear of ``plan``, ``[M, W]`` each for a LayerNorm's affine.
        plan: from :func:`plain_mlp_plan`.
        dtype: ``torch.float32`` or ``torch.bfloat16``.

    Made once per call: the cast (bf16) and the transpose to a contiguous
    ``[in, out]`` layout are paid once, not once per row chunk. The output
    layer's bias stays float32 (and its weight too unless it has one unit), so
    the bias part of Q is not rounded to bf16's 8-bit mantissa (0.4% of |Q|).
    A LayerNorm becomes a callable on ``[M, rows, W]`` (:func:`member_layer_norm`,
    its module's ``eps``) with the members' scale and shift ``[M, 1, W]`` in ``dtype``:
    its output has the hidden activations' dtype, the next Linear's.
    """
    layers: StackedMLPLayers = []
    last = max(i for i, (kind, _) in enumerate(plan) if kind == "linear")
    for i, (kind, item) in enumerate(plan):
        if kind == "act":
            layers.append(item)
            continue
        if kind == "norm":
            affine = {
                part: params.get(("module", item.name, part)).to(dtype).unsqueeze(1)
                if getattr(item, part)
                else None
                for part in ("weight", "bias")
            }
            layers.append(
                functools.partial(_rollout_layer_norm, width=item.width, eps=item.eps, **affine)
            )
            continue
        weight = params.get(("module", item, "weight"))  # [M, out, in]
        bias = params.get(("module", item, "bias"))  # [M, out]
        weight_dtype, bias_dtype = dtype, dtype
        if i == last:
            bias_dtype = torch.float32
            weight_dtype = dtype if weight.shape[1] == 1 else torch.float32
        # Transposed, then cast and laid out in one copy (not a cast, then a copy).
        weight_t = weight.transpose(1, 2).to(weight_dtype, memory_format=torch.contiguous_format)
        layers.append((weight_t, bias.to(bias_dtype).unsqueeze(1)))
    return layers


def fused_mlp_ensemble(
    inputs: torch.Tensor,
    layers: StackedMLPLayers,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """M stacked MLPs on shared rows: ``(R, in) -> (M, R)`` float32.

    Args:
        inputs: ``(R, in)``, the same rows for every member (broadcast over
            members with ``expand``, no copy of its own).
        layers: from :func:`stack_mlp_weights`.
        chunk_rows: rows per block (``None``: all at once).

    Returns:
        ``(M, R)`` float32: member m's output on row r (the output layer has
        one unit, as a Q-network's does).

    One ``baddbmm`` per layer (bias fused), activations in place. In bf16 a
    one-unit output layer is a bf16 ``bmm`` whose float32 result gets the
    float32 bias (a float32 multiply-and-sum or matrix-vector product is much
    slower at the paper's sizes; docs/speed.md). With ``chunk_rows`` the rows are processed
    in blocks, so the ``(M, rows, width)`` activations stay bounded instead of
    reaching GBs at the paper's sizes; the blocks' activations are written
    into two buffers allocated once per call (alternating layer by layer).
    Why: a block's activations are 84 MB (bf16) to 168 MB (fp32) at the
    paper's sizes, above glibc's largest ``mmap`` threshold (32 MB), so each
    fresh one would be a new mapping whose first touch page-faults, which makes
    a layer markedly slower than writing into an existing buffer (docs/speed.md).
    """
    dtype = layers[0][0].dtype
    num_rows = inputs.shape[0]
    step = num_rows if not chunk_rows or chunk_rows >= num_rows else int(chunk_rows)
    if inputs.dtype != dtype:  # cast once, not once per block
        inputs = inputs.to(dtype)
    if step == num_rows:
        return _mlp_block(inputs, layers, None).squeeze(-1).float()
    # Outside autograd (the rollout): out= buffers cannot be differentiated.
    buffers = _BlockBuffers(inputs.device) if not torch.is_grad_enabled() else None
    out = torch.empty(layers[-1][0].shape[0], num_rows, 1, device=inputs.device)
    for start in range(0, num_rows, step):
        block = inputs[start : start + step]
        _mlp_block(block, layers, buffers, out[:, start : start + step])
    return out.squeeze(-1)


class _BlockBuffers:
    """Two activation buffers allocated once per call, and their ``[M, rows, W]`` views.

    A view made once per shape and buffer serves every block of that shape: a view is an
    operation (a node in a CUDA graph, a dispatch on the host) like any other.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flat: list[torch.Tensor | None] = [None, None]
        self.views: dict[tuple, torch.Tensor] = {}

    def get(self, slot: int, shape: tuple[int, int, int], dtype: torch.dtype) -> torch.Tensor:
        key = (slot, shape, dtype)
        view = self.views.get(key)
        if view is not None:
            return view
        size = shape[0] * shape[1] * shape[2]
        buffer = self.flat[slot]
        if buffer is None or buffer.numel() < size or buffer.dtype != dtype:
            buffer = self.flat[slot] = torch.empty(size, dtype=dtype, device=self.device)
            self.views = {k: v for k, v in self.views.items() if k[0] != slot}
        view = self.views[key] = buffer[:size].view(shape)
        return view


def _mlp_block(
    hidden: torch.Tensor,
    layers: StackedMLPLayers,
    buffers: _BlockBuffers | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One block of rows ``[rows, in]`` through the stacked layers: ``[M, rows, 1]``.

    With ``buffers`` the hidden activations are written into them; with ``out``
    (``[M, rows, 1]`` float32) the output is written there.
    """
    rows = hidden.shape[0]
    first, slot = True, 0
    for layer in layers:
        if callable(layer):
            hidden = layer(hidden)
            continue
        weight, bias = layer
        if first:
            hidden = hidden.expand(weight.shape[0], *hidden.shape)
            first = False
        if weight.dtype != bias.dtype:  # bf16 one-unit output layer: float32 bias
            product = torch.bmm(hidden, weight).float()
            if out is None or torch.is_grad_enabled():  # out= is not differentiable
                product = product.add_(bias)
                return product if out is None else out.copy_(product)
            return torch.add(product, bias, out=out)
        if hidden.dtype != weight.dtype:
            hidden = hidden.to(weight.dtype)
        if buffers is None:  # e.g. one block: nothing to reuse
            hidden = torch.baddbmm(bias, hidden, weight)
            continue
        shape = (weight.shape[0], rows, weight.shape[2])
        hidden = torch.baddbmm(bias, hidden, weight, out=buffers.get(slot, shape, weight.dtype))
        slot = 1 - slot
    if out is not None:
        out.copy_(hidden)
    return hidden


def stacked_mlp_views(params: TensorDictBase, plan: MLPPlan, detach: bool = False) -> list:
    """The plan on ``params`` as :func:`stacked_mlp_forward` reads it (views, no copies).

    Each Linear as ``(weight^T [M, in, out], bias [M, 1, out])``, each LayerNorm as
    ``(spec, weight [M, 1, W] | None, bias [M, 1, W] | None)``, activations as they are;
    with ``detach`` the parameters detached. Views of detached parameters follow their
    in-place updates, so a caller may keep them between steps
    (:meth:`~cbop_torchrl.accel.loss.LossFastPaths._member_q` does).
    """
    views: list = []
    for kind, item in plan:
        if kind == "act":
            views.append(item)
            continue
        if kind == "norm":
            affine = []
            for part in ("weight", "bias"):
                value = params.get(("module", item.name, part)) if getattr(item, part) else None
                if value is not None:
                    value = (value.detach() if detach else value).unsqueeze(1)
                affine.append(value)
            views.append((item, *affine))
            continue
        weight = params.get(("module", item, "weight"))
        bias = params.get(("module", item, "bias"))
        if detach:
            weight, bias = weight.detach(), bias.detach()
        views.append((weight.transpose(1, 2), bias.unsqueeze(1)))
    return views


def stacked_mlp_forward(
    inputs: torch.Tensor,
    params: TensorDictBase | None,
    plan: MLPPlan | None,
    detach: bool = False,
    views: list | None = None,
) -> torch.Tensor:
    """M plain MLPs with stacked parameters, differentiable: ``(R, in) | (M, R, in) -> (M, R)``.

    Args:
        inputs: ``(R, in)`` shared by all members (broadcast, not copied) or
            ``(M, R, in)``, one row block per member.
        params: ``[M, ...]`` parameters, ``("module", name, "weight")`` ``[M, out, in]``
            and ``("module", name, "bias")`` ``[M, out]`` for each Linear of ``plan``,
            ``[M, W]`` each for a LayerNorm's affine.
        plan: from ``plain_mlp_plan(..., inplace=False)``.
        detach: use the parameters detached (gradients reach the inputs only).
        views: :func:`stacked_mlp_views` made already (then ``params`` and ``plan`` are
            not read).

    Returns:
        ``(M, R)`` for a one-unit output layer (``(M, R, out)`` otherwise), in
        the parameters' dtype.

    One ``baddbmm`` per Linear layer (bias fused, weights read transposed in
    place), a LayerNorm as :func:`member_layer_norm`: the same maths as
    ``torch.vmap`` over the members' modules.
    """
    if views is None:
        views = stacked_mlp_views(params, plan, detach)
    hidden = inputs
    for layer in views:
        if callable(layer):
            hidden = layer(hidden)
        elif len(layer) == 3:  # a LayerNorm: (spec, weight, bias)
            spec, weight, bias = layer
            hidden = member_layer_norm(hidden, spec.width, spec.eps, weight, bias)
        else:
            weight_t, bias = layer
            if hidden.dim() == 2:
                hidden = hidden.expand(weight_t.shape[0], *hidden.shape)
            hidden = torch.baddbmm(bias, hidden, weight_t)
    return hidden.squeeze(-1)


__all__ = [
    "LayerNormSpec",
    "MLPPlan",
    "StackedMLPLayers",
    "differentiable_relu",
    "fused_mlp_ensemble",
    "member_layer_norm",
    "plain_mlp_plan",
    "stack_mlp_weights",
    "stacked_mlp_forward",
    "stacked_mlp_views",
]
