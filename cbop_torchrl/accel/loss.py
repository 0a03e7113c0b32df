"""CBOPLoss with its fast paths: the same losses and gradients, fewer operations.

:class:`LossFastPaths` replaces the eager loss's network calls
(:class:`~cbop_torchrl.objectives.loss.CBOPLoss`: ``vmap`` over the Q-ensemble, the actor
as its module) with:

- plain MLP Q-networks (:func:`~cbop_torchrl.modules.actor_critic.make_qvalue_ensemble`) as
  one differentiable ``baddbmm`` per layer over the stacked ``[M, ...]`` parameters
  (:func:`~cbop_torchrl.accel.fused_mlp.stacked_mlp_forward`);
- a plain actor as its operations on :attr:`actor_network_params`
  (:func:`~cbop_torchrl.accel.plans.plain_actor_dist_params`): no module swap or
  TensorDict per call, ReLUs that autograd saves no output of;
- the detached Q parameters of the actor's pass made once while the parameters keep their
  storage (:meth:`LossFastPaths._detached`), not once per step;

and gives the loss's estimator the estimator's fast paths
(:mod:`cbop_torchrl.accel.estimator`). :class:`CBOPLoss` is the eager class with them;
:func:`accelerate_loss` gives an eager loss them in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor

from cbop_torchrl.accel.classes import fast_class
from cbop_torchrl.accel.estimator import accelerate_estimator
from cbop_torchrl.accel.fused_mlp import plain_mlp_plan, stacked_mlp_forward, stacked_mlp_views
from cbop_torchrl.accel.plans import actor_layers, plain_actor_dist_params, plain_actor_plan
from cbop_torchrl.accel.settings import FastPaths
from cbop_torchrl.modules.actor_critic import BoxTanhNormal
from cbop_torchrl.objectives import loss as eager


def _rows(x: Tensor, dims: int) -> Tensor:
    """``x`` ``[*lead, *batch, C]`` as ``[*lead, R, C]`` (``dims`` dimensions), or as it is."""
    if x.dim() == dims:
        return x
    return x.reshape(*x.shape[: dims - 2], -1, x.shape[-1])


class LossFastPaths:
    """The fast paths of a CBOP loss (a mixin before the eager class)."""

    def _init_fast_paths(self, paths: FastPaths) -> None:
        self.fast_paths = paths
        self._q_plan = None
        if paths.fused_q and not self.deactivate_vmap:
            self._q_plan = plain_mlp_plan(
                self.qvalue_network,
                self.qvalue_network.in_keys[0],
                self.tensor_keys.action,
                self.tensor_keys.state_action_value,
                inplace=False,
            )
        self._actor_plan = (
            plain_actor_plan(self.actor_network, self.actor_network.in_keys[0])
            if paths.fused_q
            else None
        )
        self.__dict__.pop("_detached_cache", None)

    def _member_q(
        self, tensordict: TensorDictBase, action: Tensor, params: TensorDictBase, detach: bool
    ) -> Tensor:
        """``Q_m(s, action)`` ``[M, *batch]``; ``action`` ``[*batch, A]`` or ``[M, *batch, A]``."""
        obs_key = self.qvalue_network.in_keys[0]
        batch_shape = tensordict.batch_size
        per_member = action.dim() == len(batch_shape) + 2
        if self._q_plan is not None:
            # Rows [R, .]: a reshape is an operation even to the same shape, so only if needed.
            obs = _rows(tensordict.get(obs_key), 2)
            if per_member:
                obs = obs.expand(action.shape[0], *obs.shape)
                inputs = torch.cat([obs, _rows(action, 3)], dim=-1)
            else:
                inputs = torch.cat([obs, _rows(action, 2)], dim=-1)
            views = self._detached_views(params) if detach else None
            q = stacked_mlp_forward(inputs, params, self._q_plan, views=views)
            if q.shape[1:] == batch_shape:
                return q
            return q.reshape(q.shape[0], *batch_shape)
        # the eager vmap, on the cached detached parameters (the same values as params.detach())
        return super()._member_q(
            tensordict, action, self._detached(params) if detach else params, detach=False
        )

    def _detached(self, params: TensorDictBase) -> TensorDictBase:
        """``params.detach()``, made once while the parameters keep their storage.

        A detached tensor shares its parameter's storage and version counter, so it follows
        every in-place update (optimizer step, ``load_state_dict``) and autograd's checks
        still see them; new storage (``.to(device)``) makes a new one. One ``detach`` per
        parameter tensor per step fewer.
        """
        key = (id(params), *(leaf.data_ptr() for leaf in params.values(True, True)))
        cached = self.__dict__.get("_detached_cache")
        if cached is None or cached[0] != key:
            detached = params.detach()
            views = None if self._q_plan is None else stacked_mlp_views(detached, self._q_plan)
            cached = self.__dict__["_detached_cache"] = (key, detached, views)
        return cached[1]

    def _detached_views(self, params: TensorDictBase) -> list:
        """:func:`stacked_mlp_views` of :meth:`_detached`'s parameters, kept with them."""
        self._detached(params)
        return self.__dict__["_detached_cache"][2]

    def _actor_dist(self, tensordict: TensorDictBase) -> Any:
        """The current actor's distribution at the batch's observations.

        A plain actor (:func:`~cbop_torchrl.accel.plans.plain_actor_plan`) runs as its
        operations on :attr:`actor_network_params` (``F.linear``'s ``addmm`` per layer,
        :func:`~cbop_torchrl.accel.fused_mlp.differentiable_relu`, the head's clamp and
        exp: the module's numbers and gradients); any other actor as its module.
        """
        if self._actor_plan is None:
            return super()._actor_dist(tensordict)
        obs = tensordict.get(self.actor_network.in_keys[0])
        layers = actor_layers(self.actor_network_params, self._actor_plan, torch.float32)
        loc, scale = plain_actor_dist_params(obs, layers, torch.float32)
        if obs.dim() != 2:
            loc, scale = (x.view(*obs.shape[:-1], x.shape[-1]) for x in (loc, scale))
        return BoxTanhNormal(loc, scale)


class CBOPLoss(LossFastPaths, eager.CBOPLoss):
    """:class:`cbop_torchrl.objectives.CBOPLoss` with the fast paths (its estimator's too).

    Built with the eager loss's arguments plus :class:`~cbop_torchrl.accel.FastPaths`'s
    keywords (``fused_q``, on by default, ``q_chunk_rows``, ``compile``, ``rollout_dtype``,
    ``whole_step_graph``); ``estimator_kwargs`` may hold the estimator's own (they override
    the loss's for the estimator).
    """

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        qvalue_network: TensorDictModuleBase | Sequence[TensorDictModuleBase],
        dynamics: TensorDictModuleBase,
        *,
        estimator_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        fast, kwargs = FastPaths.split(kwargs)
        estimator_fast, estimator_kwargs = FastPaths.split(estimator_kwargs or {})
        paths = FastPaths(**fast)
        estimator_paths = dataclasses.replace(paths, **estimator_fast)
        super().__init__(
            actor_network, qvalue_network, dynamics, estimator_kwargs=estimator_kwargs, **kwargs
        )
        accelerate_loss(self, paths, estimator_paths)


def accelerate_loss(
    loss: eager.CBOPLoss, paths: FastPaths, estimator_paths: FastPaths | None = None
) -> eager.CBOPLoss:
    """``loss`` and its estimator with the fast paths, in place (``estimator_paths``: the
    estimator's, default ``paths``); see :func:`~cbop_torchrl.accel.accelerate`."""
    loss.__class__ = fast_class(type(loss), LossFastPaths, eager.CBOPLoss, CBOPLoss)
    loss._init_fast_paths(paths)
    accelerate_estimator(loss.value_estimator, estimator_paths or paths)
    return loss


__all__ = ["CBOPLoss", "LossFastPaths", "accelerate_loss"]
