"""CBOP's value target inside TorchRL's ``SACLoss``, on the bundled demo data.

    python examples/sacloss_with_cbop_target.py

The README's "CBOP inside your own TorchRL code" in a form that runs: a small
dynamics ensemble is fitted on the demo data first (a few seconds; cached under
``$CBOP_TORCHRL_CACHE`` like ``cbop-train``'s), because with an untrained model every
imagined state soon looks terminal to the hopper's termination function, all horizons
beyond 0 get zero precision and the expected horizon E[h] is exactly 0. Expected output
(the numbers vary a little between machines; E[h] is between 0 and H):

    dynamics: holdout R^2 0.85 after 3 epochs
    SACLoss output keys: alpha, entropy, loss_actor, loss_alpha, loss_qvalue
    CBOP target after 20 steps: E[h] = 0.91 of H = 5, weights w_h = [0.469, 0.296, 0.145,
    0.052, 0.023, 0.014]
    CBOPLoss output adds: cbop/expected_horizon, cbop/posterior_std, cbop/target_mean,
    cbop/valid_fraction, cbop/value_var_share, cbop/weights

E[h] near 1 with falling weights is what an untrained critic next to a fitted model
gives: the model's spread grows with the horizon. In a run, BC and FQE pretraining come
first and E[h] moves as the critic learns (``cbop-train`` prints it at the start and the
end of CBOP).

``SACLossWithCBOPTarget`` returns the keys of TorchRL's ``SACLoss`` only; the target's
diagnostics (``expected_horizon``, ``weights`` ``[H+1]``, ``posterior_std``,
``value_var_share`` ``[H+1]``, ``target_mean``) are in the estimator's
``last_diagnostics`` after each call. :class:`~cbop_torchrl.objectives.CBOPLoss` (the
project's loss, with EDAC's diversity term) puts them in its output as ``cbop/*``.
"""

from __future__ import annotations

from typing import Any

import torch
from torchrl.objectives import SoftUpdate

from cbop_torchrl.config import DynamicsConfig
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives import CBOPLoss, CBOPValueEstimator, SACLossWithCBOPTarget
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics

BATCH_KEYS = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "done"),
)


def main(steps: int = 20, horizon: int = 5, num_qvalue_nets: int = 5) -> dict[str, Any]:
    """Fits the model, takes ``steps`` SAC steps on CBOP targets, prints and returns what
    the README shows: ``expected_horizon``, ``weights`` (a list of H+1 floats), the
    SACLoss output keys and the ``cbop/*`` keys of CBOPLoss's output."""
    torch.manual_seed(0)
    data, info = load_dataset_with_info("demo")  # hopper, 11 observations, 3 actions
    obs_dim, act_dim = info.obs_dim, info.action_dim
    model_config = DynamicsConfig(
        num_members=5, num_elites=3, hidden_size=64, num_layers=2,
        weight_decay=(2.5e-5, 5e-5, 1e-4), max_epochs=3, max_holdout=2000,
    )  # fmt: skip
    dynamics, fit = load_or_train_dynamics(
        data, info, model_config, progress=False, termination="hopper"
    )
    print(f"dynamics: holdout R^2 {fit['holdout_r2_mean']:.2f} after {fit['epochs']} epochs")

    actor = make_actor(obs_dim, act_dim)
    qvalues = make_qvalue_ensemble(num_qvalue_nets, obs_dim, act_dim)
    loss = SACLossWithCBOPTarget(
        actor, qvalues, num_qvalue_nets=num_qvalue_nets, action_spec=action_spec(act_dim),
        loss_function="l2",
    )  # fmt: skip
    updater = SoftUpdate(loss, tau=5e-3)  # before the first target is computed
    loss.make_value_estimator(
        CBOPValueEstimator.from_sac_loss(loss, dynamics, gamma=0.99, horizon=horizon, psi=2.0)
    )
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)
    batches = data.select(*BATCH_KEYS)
    for _ in range(steps):
        batch = batches[torch.randint(batches.shape[0], (256,))]
        losses = loss(batch)  # the critic regresses on CBOP targets
        (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
        optim.step()
        optim.zero_grad()
        updater.step()
    diagnostics = loss.value_estimator.last_diagnostics
    expected_horizon = float(diagnostics["expected_horizon"])
    weights = [round(float(w), 3) for w in diagnostics["weights"]]
    sac_keys = sorted(losses.keys())
    print(f"SACLoss output keys: {', '.join(sac_keys)}")
    print(
        f"CBOP target after {steps} steps: E[h] = {expected_horizon:.2f} of H = {horizon}, "
        f"weights w_h = {weights}"
    )

    cbop = CBOPLoss(
        actor, qvalues, dynamics, action_spec=action_spec(act_dim), horizon=horizon, psi=2.0
    )
    SoftUpdate(cbop, tau=5e-3)
    cbop_keys = sorted(
        "/".join(key) for key in cbop(batch).keys(True, True) if isinstance(key, tuple)
    )
    print(f"CBOPLoss output adds: {', '.join(cbop_keys)}")
    return {
        "expected_horizon": expected_horizon,
        "weights": weights,
        "sac_keys": sac_keys,
        "cbop_keys": cbop_keys,
    }


if __name__ == "__main__":
    main()
