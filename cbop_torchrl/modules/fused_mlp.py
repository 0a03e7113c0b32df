"""An ensemble of M plain MLPs run as one batched matmul per layer, on stacked parameters.

The Q-ensemble (:func:`~cbop_torchrl.modules.actor_critic.make_qvalue_ensemble`)
is M TorchRL ``ValueOperator``s over ``nn.Sequential(Linear, act, ..., Linear)``
whose parameters ``SACLoss`` stacks into one ``[M, ...]`` TensorDict. Instead of
``torch.vmap`` over the members' modules, these helpers read the network's
layer sequence once (:func:`plain_mlp_plan`) and run every member at once
with one ``baddbmm`` per Linear layer (bias fused): the same maths as ``vmap``
over the members' ``nn.Linear``s, fewer passes over the activations.

- :func:`stack_mlp_weights` + :func:`fused_mlp_ensemble`: for the CBOP
  estimator's rollouts (no gradient): weights cast (bf16) and transposed once
  per call, activations in place, rows in bounded blocks.
- :func:`stacked_mlp_forward`: differentiable (the CBOP loss's critic, EDAC
  and actor passes).

Shapes: M members, R rows, ``in`` the input width (observation + action).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

MLPPlan: TypeAlias = list[tuple[str, Any]]
"""A network's layers in order: ``("linear", child name)`` or ``("act", activation fn)``."""
StackedMLPLayers: TypeAlias = list[
    tuple[torch.Tensor, torch.Tensor] | Callable[[torch.Tensor], torch.Tensor]
]
"""A plan with each Linear as ``(weight [M, in, out], bias [M, 1, out])``, activations as is."""

_INPLACE_ACTIVATIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: torch.relu_,
    nn.Tanh: torch.tanh_,
    nn.SiLU: lambda x: F.silu(x, inplace=True),
}
#: The same activations out of place, for paths that autograd differentiates.
_ACTIVATIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: torch.relu,
    nn.Tanh: torch.tanh,
    nn.SiLU: F.silu,
}


def plain_mlp_plan(
    qvalue_network: TensorDictModuleBase,
    obs_key: str,
    action_key: str,
    q_value_key: str,
    inplace: bool = True,
) -> MLPPlan | None:
    """``[("linear", name) | ("act", fn), ...]`` if the network is a plain MLP, else None.

    Plain means: reads ``[obs_key, action_key]`` (concatenated in that order, as
    TorchRL's ``MLP`` does), writes ``[q_value_key]``, and its ``module`` is an
    ``nn.Sequential`` of ``nn.Linear`` and ReLU/Tanh/SiLU layers only. The
    activations run in place unless ``inplace=False`` (under autograd).
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
            each Linear of ``plan``.
        plan: from :func:`plain_mlp_plan`.
        dtype: ``torch.float32`` or ``torch.bfloat16``.

    Made once per call: the cast (bf16) and the transpose to a contiguous
    ``[in, out]`` layout are paid once, not once per row chunk. The output
    layer's bias stays float32 (and its weight too unless it has one unit), so
    the bias part of Q is not rounded to bf16's 8-bit mantissa (0.4% of |Q|).
    """
    layers: StackedMLPLayers = []
    last = max(i for i, (kind, _) in enumerate(plan) if kind == "linear")
    for i, (kind, item) in enumerate(plan):
        if kind == "act":
            layers.append(item)
            continue
        weight = params.get(("module", item, "weight"))  # [M, out, in]
        bias = params.get(("module", item, "bias"))  # [M, out]
        weight_dtype, bias_dtype = dtype, dtype
        if i == last:
            bias_dtype = torch.float32
            weight_dtype = dtype if weight.shape[1] == 1 else torch.float32
        layers.append(
            (
                weight.to(weight_dtype).transpose(1, 2).contiguous(),
                bias.to(bias_dtype).unsqueeze(1),
            )
        )
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
    float32 bias (a float32 multiply-and-sum or matrix-vector product was 8x
    slower at the paper's sizes). With ``chunk_rows`` the rows are processed
    in blocks, so the ``(M, rows, width)`` activations stay bounded instead of
    reaching GBs at the paper's sizes; the blocks' activations are written
    into two buffers allocated once per call (alternating layer by layer).
    Why: a block's activations are 84 MB (bf16) to 168 MB (fp32) at the
    paper's sizes, above glibc's largest ``mmap`` threshold (32 MB), so each
    fresh one was a new mapping whose first touch page-faults: measured on the
    2-core CPU, that made the first layer 2.8x and a 256 x 256 layer 1.3x
    slower than writing into an existing buffer.
    """
    dtype = layers[0][0].dtype
    num_rows = inputs.shape[0]
    step = num_rows if not chunk_rows or chunk_rows >= num_rows else int(chunk_rows)
    out = None
    # Outside autograd (the rollout): out= buffers cannot be differentiated.
    reuse = step < num_rows and not torch.is_grad_enabled()
    buffers: list[torch.Tensor | None] = [None, None]
    for start in range(0, num_rows, step):
        hidden = inputs[start : start + step].to(dtype)
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
                hidden = torch.bmm(hidden, weight).float() + bias
                continue
            if hidden.dtype != weight.dtype:
                hidden = hidden.to(weight.dtype)
            if not reuse:  # e.g. one block: nothing to reuse
                hidden = torch.baddbmm(bias, hidden, weight)
                continue
            shape = (weight.shape[0], rows, weight.shape[2])
            size = shape[0] * shape[1] * shape[2]
            buffer = buffers[slot]
            if buffer is None or buffer.numel() < size or buffer.dtype != weight.dtype:
                buffer = buffers[slot] = torch.empty(size, dtype=weight.dtype, device=inputs.device)
            hidden = torch.baddbmm(bias, hidden, weight, out=buffer[:size].view(shape))
            slot = 1 - slot
        if step == num_rows:
            return hidden.squeeze(-1).float()
        if out is None:
            out = torch.empty(hidden.shape[0], num_rows, device=inputs.device)
        out[:, start : start + step] = hidden.squeeze(-1)
    return out


def stacked_mlp_forward(
    inputs: torch.Tensor, params: TensorDictBase, plan: MLPPlan, detach: bool = False
) -> torch.Tensor:
    """M plain MLPs with stacked parameters, differentiable: ``(R, in) | (M, R, in) -> (M, R)``.

    Args:
        inputs: ``(R, in)`` shared by all members (broadcast, not copied) or
            ``(M, R, in)``, one row block per member.
        params: ``[M, ...]`` parameters, ``("module", name, "weight")`` ``[M, out, in]``
            and ``("module", name, "bias")`` ``[M, out]`` for each Linear of ``plan``.
        plan: from ``plain_mlp_plan(..., inplace=False)``.
        detach: use the parameters detached (gradients reach the inputs only).

    Returns:
        ``(M, R)`` for a one-unit output layer (``(M, R, out)`` otherwise), in
        the parameters' dtype.

    One ``baddbmm`` per Linear layer (bias fused, weights read transposed in
    place), the same maths as ``torch.vmap`` over the members' ``nn.Linear``s.
    """
    hidden = inputs
    for kind, item in plan:
        if kind == "act":
            hidden = item(hidden)
            continue
        weight = params.get(("module", item, "weight"))
        bias = params.get(("module", item, "bias"))
        if detach:
            weight, bias = weight.detach(), bias.detach()
        if hidden.dim() == 2:
            hidden = hidden.expand(weight.shape[0], *hidden.shape)
        hidden = torch.baddbmm(bias.unsqueeze(1), hidden, weight.transpose(1, 2))
    return hidden.squeeze(-1)


__all__ = [
    "MLPPlan",
    "StackedMLPLayers",
    "fused_mlp_ensemble",
    "plain_mlp_plan",
    "stack_mlp_weights",
    "stacked_mlp_forward",
]
