"""The one place that relies on TorchRL internals, each with the reason (issue 17, item 6).

Checked against TorchRL ``TORCHRL_CHECKED`` (``tests/test_torchrl_compat.py``
checks every assumption below, so a TorchRL upgrade that breaks one fails there
first, with the name of what changed).

- :class:`SACTargetFromEstimator` overrides ``SACLoss._compute_target_v2``.
  SACLoss (version 2) has no public hook for its critic target: before it asks
  its value estimator, ``_compute_target_v2`` samples ``a' ~ pi(.|s')`` and
  runs all M target Q-networks on it to write ``("next", "state_value")``.
  CBOP's estimator makes its own bootstrap from model rollouts, so that work
  would be thrown away every step.

Everything else the package once took from TorchRL's private API now has a
public replacement here or where it is used: :func:`vmap_over_params`
(instead of ``torchrl.objectives.utils._vmap_func``), ``loss.log_alpha``
(instead of ``SACLoss._alpha``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

#: The TorchRL version the internals used here were checked against.
TORCHRL_CHECKED = "0.14.1"


class SACTargetFromEstimator:
    """Mixin for a TorchRL ``SACLoss`` (v2) subclass: the critic target is the value estimator's.

    ``class MyLoss(SACTargetFromEstimator, SACLoss)`` regresses the Q-ensemble on
    ``loss.value_estimator.value_estimate(batch)`` ``[*batch]`` alone; SACLoss's
    own bootstrap from ``s'`` (one actor pass and M target-Q passes) is skipped.
    """

    def _compute_target_v2(self, tensordict: TensorDictBase) -> torch.Tensor:
        return self.value_estimator.value_estimate(tensordict).squeeze(-1)


def vmap_over_params(
    module: torch.nn.Module,
    in_dims: tuple[Any, ...] = (None, 0),
    randomness: str = "error",
    loop: bool = False,
) -> Callable[[TensorDictBase, TensorDictBase], TensorDictBase]:
    """``f(tensordict, params)``: ``module`` run with every slice of stacked ``params``.

    ``params`` holds ``[M, ...]`` parameters of ``module`` (e.g.
    ``TensorDict.from_modules(*nets, as_module=True)``); ``in_dims`` says which
    arguments carry the member dim (``(None, 0)``: a shared input; ``(0, 0)``:
    one input slice per member). The output TensorDict has a leading ``M``.
    Built on ``torch.vmap`` and ``TensorDictBase.to_module`` (public APIs);
    ``loop=True`` runs the members one after another (debugging).
    """

    def call(tensordict: TensorDictBase, params: TensorDictBase) -> TensorDictBase:
        with params.to_module(module, preserve_module_state=False):
            return module(tensordict)

    if not loop:
        return torch.vmap(call, in_dims, randomness=randomness)

    def looped(tensordict: TensorDictBase, params: TensorDictBase) -> TensorDictBase:
        members = params.batch_size[0]
        outs = [
            # A shallow copy per member: the module writes its output into its input.
            call(tensordict.clone(False) if in_dims[0] is None else tensordict[m], params[m])
            for m in range(members)
        ]
        return torch.stack(outs)

    return looped
