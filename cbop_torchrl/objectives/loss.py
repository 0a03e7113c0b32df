"""CBOPLoss: TorchRL's SACLoss with an M-member Q-ensemble, EDAC diversity and the CBOP target.

Everything SAC does is inherited unchanged from ``SACLoss`` (version 2, no
state-value network):

- actor loss ``alpha * log pi(a~|s) - min_m Q_m(s, a~)`` (min over all M members);
- critic loss ``sum_m (Q_m(s, a) - y)^2`` averaged over the batch: with
  ``loss_function="l2"`` SACLoss uses ``F.mse_loss`` (no 1/2 factor) per member
  and sums over members, exactly EDAC's/CBOP's ``sum_m MSE_m``;
- automatic alpha, target entropy ``-|A|`` from ``action_spec``.

What CBOPLoss changes:

- the target ``y`` comes from a :class:`CBOPValueEstimator` wired to this
  loss (it reads the current actor, the TARGET Q parameters and alpha);
- ``loss_qvalue`` also holds ``eta * L_ES``, EDAC's ensemble-diversity term
  (An et al. 2021, eq. 5 with normalized gradients):
  ``L_ES = E_(s,a)[ 1/(M-1) * sum_{i != j} cos(grad_a Q_i(s,a), grad_a Q_j(s,a)) ]``;
- BEYOND THE PAPER, off by default: with ``bc_weight > 0``, ``loss_actor`` also
  holds ``bc_weight * E_(s,a)[-log pi(a|s)]`` at the dataset's actions, a
  behaviour-cloning pull that keeps the actor near the data (docs/learning.md).

Output keys (``reduction="mean"``): ``loss_actor``, ``loss_qvalue`` (MSE sum +
``eta * L_ES``), ``loss_alpha``, ``alpha``, ``entropy`` (as SACLoss), plus
``edac_penalty`` (``L_ES`` itself, detached), ``qvalue_mse`` (the MSE part,
detached), ``bc_nll`` (with ``bc_weight > 0``: the BC term above, detached)
and ``cbop`` (the estimator's diagnostics: ``weights`` ``(H+1,)``,
``expected_horizon``, ``posterior_std``, ``value_var_share`` ``(H+1,)``,
``valid_fraction`` ``(H+1,)``, ``target_mean``). Only ``loss_*`` keys are
losses: summing them gives the full objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor
from torchrl.data import TensorSpec
from torchrl.objectives import SACLoss

from cbop_torchrl._torchrl_compat import SACTargetFromEstimator, vmap_over_params
from cbop_torchrl.objectives.diversity import gradient_diversity_penalty
from cbop_torchrl.objectives.estimator import CBOPValueEstimator
from cbop_torchrl.objectives.pretrain import ACTION_EPS


class CBOPLoss(SACTargetFromEstimator, SACLoss):
    """SAC/EDAC loss whose critic regresses on CBOP's conservative target.

    Args:
        actor_network: the TanhNormal actor (:func:`make_actor`).
        qvalue_network: the Q-ensemble as a list of M networks
            (:func:`make_qvalue_ensemble`); a single network is copied M times
            with SACLoss's re-initialization (not recommended).
        dynamics: the dynamics model (see :class:`CBOPValueEstimator`).
        action_spec: the action spec (sets the target entropy ``-|A|``).
        num_qvalue_nets: M (default: ``len(qvalue_network)``).
        gamma, horizon, psi, mode, termination, rollout_dtype, seed: estimator
            settings, see :class:`CBOPValueEstimator`.
        compile: on CUDA, compile the target's Q-ensemble with CUDA graphs
            (``CBOPValueEstimator(compile=True)``); ignored on CPU.
        eta: weight of the EDAC diversity term (paper: 1; 0 disables it).
        bc_weight: BEYOND THE PAPER: weight of the actor's negative log-likelihood
            of the dataset's actions, in units of Q per nat (0, the paper: none).
        loss_function: SACLoss's critic distance (default ``"l2"``).
        estimator_kwargs: further :class:`CBOPValueEstimator` arguments
            (``fixed_weighting``, ``lmbda``, ``quantile``, ``num_particles``, ...).
        **sac_kwargs: further ``SACLoss`` arguments (``alpha_init``, ...).
    """

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        qvalue_network: TensorDictModuleBase | Sequence[TensorDictModuleBase],
        dynamics: TensorDictModuleBase,
        *,
        action_spec: TensorSpec | None = None,
        num_qvalue_nets: int | None = None,
        gamma: float = 0.99,
        horizon: int = 10,
        psi: float = 1.0,
        mode: str = "lcb",
        termination: str = "zero_precision",
        rollout_dtype: torch.dtype | str = torch.float32,
        seed: int | None = None,
        compile: bool = False,
        eta: float = 1.0,
        bc_weight: float = 0.0,
        loss_function: str = "l2",
        estimator_kwargs: dict[str, Any] | None = None,
        **sac_kwargs: Any,
    ) -> None:
        if num_qvalue_nets is None:
            if not isinstance(qvalue_network, (list, tuple)):
                raise ValueError(
                    "CBOPLoss needs the Q-ensemble as a list of M networks "
                    "(make_qvalue_ensemble), or num_qvalue_nets=M with a single network."
                )
            num_qvalue_nets = len(qvalue_network)
        if num_qvalue_nets < 2:
            raise ValueError(
                f"CBOP needs a Q-ensemble of at least 2 members for its value variance; "
                f"got num_qvalue_nets={num_qvalue_nets}."
            )
        if eta < 0:
            raise ValueError(f"eta must be >= 0; got {eta}.")
        if bc_weight < 0:
            raise ValueError(f"bc_weight must be >= 0; got {bc_weight}.")
        super().__init__(
            actor_network,
            qvalue_network,
            num_qvalue_nets=num_qvalue_nets,
            action_spec=action_spec,
            loss_function=loss_function,
            **sac_kwargs,
        )
        self.eta = float(eta)
        self.bc_weight = float(bc_weight)
        estimator = CBOPValueEstimator.from_sac_loss(
            self,
            dynamics,
            gamma=gamma,
            horizon=horizon,
            psi=psi,
            mode=mode,
            termination=termination,
            rollout_dtype=rollout_dtype,
            seed=seed,
            compile=compile,
            **(estimator_kwargs or {}),
        )
        self.make_value_estimator(estimator)

    def edac_penalty(self, tensordict: TensorDictBase) -> Tensor:
        """EDAC's ``1/(M-1) sum_{i != j} cos(g_i, g_j)`` per sample ``[*batch]``.

        ``g_m = grad_a Q_m(s, a)`` at the dataset action, differentiable in the
        Q parameters (``create_graph``). Uses ``||sum_m n_m||^2 - sum_m ||n_m||^2
        = sum_{i != j} <n_i, n_j>`` for the normalized ``n_m``: O(M) instead of O(M^2).
        """
        num_members = self.num_qvalue_nets
        td = tensordict.select(*self.qvalue_network.in_keys, strict=False)
        with torch.enable_grad():  # the action gradient is needed even under no_grad
            action = td.get(self.tensor_keys.action).detach().requires_grad_()
            # A broadcast view: autograd gives the gradient of each member slice separately.
            member_action = action.unsqueeze(0).expand(num_members, *action.shape)
            td = td.expand(num_members, *td.batch_size).clone(False)
            td.set(self.tensor_keys.action, member_action)
            # Members on their own copy of the input (in_dims (0, 0)): per-member gradients.
            member_q = vmap_over_params(
                self.qvalue_network, (0, 0), self.vmap_randomness, loop=self.deactivate_vmap
            )
            q = member_q(td, self.qvalue_network_params)
            q = q.get(self.tensor_keys.state_action_value)
            (grad,) = torch.autograd.grad(q.sum(), member_action, create_graph=True)
        return gradient_diversity_penalty(grad)  # grad: [M, *batch, A]

    def behaviour_nll(self, tensordict: TensorDictBase) -> Tensor:
        """``-log pi(a|s)`` of the dataset's actions under the current actor ``[*batch]``."""
        action = tensordict.get(self.tensor_keys.action)
        obs = tensordict.select(*self.actor_network.in_keys, strict=False)
        with self.actor_network_params.to_module(self.actor_network):
            dist = self.actor_network.get_dist(obs)
        # log pi is infinite on the box's edges, where recorded actions may sit.
        return -dist.log_prob(action.clamp(-1.0 + ACTION_EPS, 1.0 - ACTION_EPS))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """SACLoss's losses with the EDAC term and the CBOP diagnostics (module doc)."""
        td_out = super().forward(tensordict)
        if self.bc_weight > 0:
            nll = self._reduce_loss(self.behaviour_nll(tensordict), tensordict=tensordict)
            td_out.set("loss_actor", td_out.get("loss_actor") + self.bc_weight * nll)
            if td_out.batch_size == torch.Size([]):
                td_out.set("bc_nll", nll.detach())
        mse = td_out.get("loss_qvalue")
        if self.eta > 0:
            penalty = self._reduce_loss(self.edac_penalty(tensordict), tensordict=tensordict)
            td_out.set("loss_qvalue", mse + self.eta * penalty)
        else:
            penalty = torch.zeros_like(mse)
        if td_out.batch_size == torch.Size([]):
            td_out.set("qvalue_mse", mse.detach())
            td_out.set("edac_penalty", penalty.detach())
            diagnostics = self.value_estimator.last_diagnostics
            if diagnostics is not None:
                td_out.set("cbop", diagnostics)
        return td_out


class SACLossWithCBOPTarget(SACTargetFromEstimator, SACLoss):
    """TorchRL's ``SACLoss`` whose critic regresses on its value estimator's target alone.

    For CBOP inside your own TorchRL code: build it with SACLoss's arguments,
    then ``loss.make_value_estimator(CBOPValueEstimator.from_sac_loss(loss, dynamics))``.
    A stock ``SACLoss`` given the estimator trains on the same targets but first
    computes its own bootstrap from ``s'`` (an actor pass and M target-Q passes)
    and throws it away; this class skips it. It has no EDAC diversity term
    (``loss_qvalue`` is SACLoss's summed MSE, as :class:`CBOPLoss` with ``eta=0``);
    :class:`CBOPLoss` adds it.
    """

