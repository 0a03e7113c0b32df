"""CBOPLoss: TorchRL's SACLoss with an M-member Q-ensemble, EDAC diversity and the CBOP target.

The losses themselves are on one page, :func:`~cbop_torchrl.objectives.cbop_update.cbop_losses`
(``forward`` calls it), with the optimizer, the step and the Polyak update beside them:

- critic loss ``sum_m (Q_m(s, a) - y)^2`` averaged over the batch (``loss_function="l2"``:
  ``F.mse_loss`` per member, no 1/2 factor, summed over members: EDAC's/CBOP's
  ``sum_m MSE_m``), plus ``eta * L_ES``, EDAC's ensemble-diversity term (An et al. 2021,
  eq. 5 with normalized gradients):
  ``L_ES = E_(s,a)[ 1/(M-1) * sum_{i != j} cos(grad_a Q_i(s,a), grad_a Q_j(s,a)) ]``;
- the target ``y`` comes from a :class:`CBOPValueEstimator` wired to this loss (it
  reads the current actor, the TARGET Q parameters and alpha);
- actor loss ``alpha * log pi(a~|s) - min_m Q_m(s, a~)`` (min over all M members) and
  SACLoss's automatic alpha, target entropy ``-|A|`` from ``action_spec``;
- BEYOND THE PAPER, off by default: with ``bc_weight > 0``, ``loss_actor`` also
  holds ``bc_weight * E_(s,a)[-log pi(a|s)]`` at the dataset's actions, a
  behaviour-cloning pull that keeps the actor near the data (docs/learning.md);
- BEYOND THE PAPER, off by default: with ``critic_penalty > 0``, ``loss_qvalue``
  also holds ``critic_penalty * E_s[sum_m (Q_m(s, a_pi) - Q_m(s, a_data))]``
  with ``a_pi ~ pi(.|s)`` drawn without gradient: each member is pushed down at
  the policy's actions and up at the data's (a CQL/COMBO-style gap without the
  log-sum-exp), so Q is no longer flat in the action off the data.

This class holds the networks' parameters (SACLoss's layout, so checkpoints keep their
keys) and the forms the page calls: the critic's MSE and EDAC's action gradients come from
ONE Q-ensemble forward on ``(s, a)`` (SACLoss and a separate EDAC pass would run it
twice), and the BC term reuses the actor loss's policy distribution. Its Q-ensemble runs
through ``torch.vmap`` over the stacked ``[M, ...]`` parameters and its actor as its module:
the eager form. :mod:`cbop_torchrl.accel` has the fast forms (one ``baddbmm`` per layer
for plain MLP Q-networks, a plain actor as its matmuls, cached detached parameters, the
estimator's fast paths): ``accel.accelerate(loss)``.

Output keys (``reduction="mean"``; ``"sum"`` sums instead, ``"none"`` is refused): ``loss_actor``,
``loss_qvalue`` (MSE sum + ``eta * L_ES``), ``loss_alpha``, ``alpha``, ``entropy`` (as
SACLoss), plus ``edac_penalty`` (``L_ES`` itself, detached), ``qvalue_mse`` (the MSE part,
detached), ``bc_nll`` (with ``bc_weight > 0``: the BC term above, detached),
``critic_gap`` (with ``critic_penalty > 0``: the members' mean of
``Q_m(s, a_pi) - Q_m(s, a_data)``, detached) and ``cbop`` (the estimator's
diagnostics: ``weights`` ``(H+1,)``, ``expected_horizon``, ``posterior_std``,
``value_var_share`` ``(H+1,)``, ``valid_fraction`` ``(H+1,)``, ``target_mean``).
Only ``loss_*`` keys are losses: summing them gives the full objective.

The loss reads its batch and never writes into it, so a batch can be the static input
of a captured step (:class:`~cbop_torchrl.accel.CapturedStep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor
from torchrl.data import TensorSpec
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.objectives import SACLoss

from cbop_torchrl._torchrl_compat import SACTargetFromEstimator, vmap_over_params
from cbop_torchrl.objectives.cbop_update import cbop_losses
from cbop_torchrl.objectives.diversity import gradient_diversity_penalty
from cbop_torchrl.objectives.estimator import CBOPValueEstimator
from cbop_torchrl.objectives.pretrain import data_action_log_prob


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
        gamma, horizon, psi, mode, termination, seed: estimator settings, see
            :class:`CBOPValueEstimator`.
        eta: weight of the EDAC diversity term (paper: 1; 0 disables it).
        bc_weight: BEYOND THE PAPER: weight of the actor's negative log-likelihood
            of the dataset's actions, in units of Q per nat (0, the paper: none).
        critic_penalty: BEYOND THE PAPER: weight of each member's gap
            ``Q_m(s, a_pi) - Q_m(s, a_data)`` in the critic's loss (0, the paper: none).
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
        seed: int | None = None,
        eta: float = 1.0,
        bc_weight: float = 0.0,
        critic_penalty: float = 0.0,
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
        if not 0 <= critic_penalty < float("inf"):
            raise ValueError(f"critic_penalty must be a finite number >= 0; got {critic_penalty}.")
        if sac_kwargs.get("reduction") == "none":
            raise ValueError(
                "CBOPLoss reduces its losses over the batch (reduction='mean', the default, "
                "or 'sum'); got reduction='none'."
            )
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
        self.critic_penalty = float(critic_penalty)
        estimator = CBOPValueEstimator.from_sac_loss(
            self,
            dynamics,
            gamma=gamma,
            horizon=horizon,
            psi=psi,
            mode=mode,
            termination=termination,
            seed=seed,
            **(estimator_kwargs or {}),
        )
        self.make_value_estimator(estimator)
        # SACLoss builds its target entropy at the first loss call, a host-to-device copy
        # inside the first step (which a CUDA graph capture cannot contain): build it now.
        _ = self.target_entropy

    def _member_q(
        self, tensordict: TensorDictBase, action: Tensor, params: TensorDictBase, detach: bool
    ) -> Tensor:
        """``Q_m(s, action)`` ``[M, *batch]``; ``action`` ``[*batch, A]`` or ``[M, *batch, A]``.

        ``vmap`` over the members' parameters (``params.detach()`` with ``detach``: the
        gradients reach the action only).
        """
        batch_shape = tensordict.batch_size
        per_member = action.dim() == len(batch_shape) + 2
        td = tensordict.select(*self.qvalue_network.in_keys, strict=False)
        if per_member:
            td = td.expand(action.shape[0], *batch_shape).clone(False)
        td.set(self.tensor_keys.action, action)
        member_q = vmap_over_params(
            self.qvalue_network,
            (0 if per_member else None, 0),
            self.vmap_randomness,
            loop=self.deactivate_vmap,
        )
        params = params.detach() if detach else params
        return member_q(td, params).get(self.tensor_keys.state_action_value).squeeze(-1)

    def _q_and_action_gradients(
        self, tensordict: TensorDictBase, with_gradients: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``Q_m(s, a)`` ``[M, *batch]`` at the data's actions and, if asked, ``grad_a Q_m``.

        The gradients ``[M, *batch, A]`` are differentiable in the Q parameters
        (``create_graph``) and come from the same forward as the Q values.
        """
        params = self.qvalue_network_params
        action = tensordict.get(self.tensor_keys.action)
        if not with_gradients:
            return self._member_q(tensordict, action, params, detach=False), None
        with torch.enable_grad():  # the action gradient is needed even under no_grad
            action = action.detach().requires_grad_()
            # A broadcast view: autograd gives the gradient of each member slice separately.
            member_action = action.unsqueeze(0).expand(self.num_qvalue_nets, *action.shape)
            q = self._member_q(tensordict, member_action, params, detach=False)
            (grad,) = torch.autograd.grad(q.sum(), member_action, create_graph=True)
        return q, grad

    def edac_penalty(self, tensordict: TensorDictBase) -> Tensor:
        """EDAC's ``1/(M-1) sum_{i != j} cos(g_i, g_j)`` per sample ``[*batch]``.

        ``g_m = grad_a Q_m(s, a)`` at the dataset action, differentiable in the
        Q parameters (``create_graph``). Uses ``||sum_m n_m||^2 - sum_m ||n_m||^2
        = sum_{i != j} <n_i, n_j>`` for the normalized ``n_m``: O(M) instead of O(M^2).
        """
        _, grad = self._q_and_action_gradients(tensordict, with_gradients=True)
        return gradient_diversity_penalty(grad)  # grad: [M, *batch, A]

    def _actor_dist(self, tensordict: TensorDictBase) -> Any:
        """The current actor's distribution at the batch's observations (its module run on
        :attr:`actor_network_params`)."""
        with self.actor_network_params.to_module(self.actor_network):
            # On a selection: the actor writes its loc/scale into what it is given.
            obs = tensordict.select(*self.actor_network.in_keys, strict=False)
            return self.actor_network.get_dist(obs)

    def _policy_action(self, tensordict: TensorDictBase) -> Tensor:
        """``a ~ pi(.|s)`` ``[*batch, A]`` from the current actor, without gradient."""
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            return self._actor_dist(tensordict).sample()

    def _nll(self, dist: Any, tensordict: TensorDictBase) -> Tensor:
        return -data_action_log_prob(dist, tensordict.get(self.tensor_keys.action))

    def behaviour_nll(self, tensordict: TensorDictBase) -> Tensor:
        """``-log pi(a|s)`` of the dataset's actions under the current actor ``[*batch]``."""
        return self._nll(self._actor_dist(tensordict), tensordict)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The target, the critic's MSE + EDAC, the actor's and alpha's losses (module doc):
        :func:`~cbop_torchrl.objectives.cbop_update.cbop_losses`."""
        return cbop_losses(self, tensordict)


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
