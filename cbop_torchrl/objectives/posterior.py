"""CBOP's Bayesian combination of h-step returns (paper section 3, DESIGN.md section 1).

Every function here is pure tensor math on a ``returns`` tensor of shape
``(*batch, H+1, K, M)``: the h-step value-expansion samples for horizon
``h = 0..H``, dynamics particle ``k`` and target-Q member ``m``. Nothing here
runs a network, so the statistics can be tested against the paper's equations
directly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: Lower bound on every per-horizon variance ``sigma2_h``. When all K*M
#: samples of a horizon coincide (for instance h = 0 with a collapsed
#: Q-ensemble) the precision ``1/sigma2_h`` would be infinite and the weights
#: NaN. 1e-5 is the floor of the reference implementation; it is far below the
#: variance of any trained ensemble on D4RL returns (which are O(1e2)).
VAR_FLOOR = 1e-5


class GaussianPosterior(NamedTuple):
    """The posterior ``N(mean, var)`` over the target value and its ingredients.

    Shapes, for ``returns`` of shape ``(*batch, H+1, K, M)``:

    - ``mean``, ``var``: ``(*batch,)``, posterior mean ``mu`` and variance ``sigma2``.
    - ``weights``: ``(*batch, H+1)``, ``w_h = rho_h / sum_h rho_h`` (zero where invalid).
    - ``mu_h``, ``var_h``: ``(*batch, H+1)``, per-horizon mean and floored variance.
    - ``var_value``: ``(*batch, H+1)``, ``A = E_k[Var_m R_h]``, the Q-ensemble part.
    - ``var_model``: ``(*batch, H+1)``, ``B = Var_k[E_m R_h]``, the dynamics part.
    """

    mean: torch.Tensor
    var: torch.Tensor
    weights: torch.Tensor
    mu_h: torch.Tensor
    var_h: torch.Tensor
    var_value: torch.Tensor
    var_model: torch.Tensor


def _check_returns(returns: torch.Tensor) -> None:
    if returns.ndim < 3:
        raise ValueError(
            f"returns must have shape (*batch, H+1, K, M) (horizon, dynamics particle, "
            f"Q member); got a tensor of shape {tuple(returns.shape)}."
        )


def gaussian_posterior(
    returns: torch.Tensor,
    valid: torch.Tensor | None = None,
    var_floor: float = VAR_FLOOR,
    unbiased: bool = False,
) -> GaussianPosterior:
    """Per-horizon Gaussian likelihoods combined under an improper prior.

    ``mu_h`` is the mean of the K*M samples of horizon h; ``sigma2_h = A + B``
    by the law of total variance with population (1/N) moments, floored at
    ``var_floor``; with ``unbiased`` it is the K*M samples' unbiased variance (divisor
    ``K*M - 1``, ``torch.var``'s default, as the authors' code computes it), i.e. ``A + B``
    times ``K*M / (K*M - 1)``, floored after the factor. The posterior has precision
    ``sum_h rho_h`` with ``rho_h = 1 / sigma2_h`` and mean ``sum_h w_h mu_h``.

    Args:
        returns: ``(*batch, H+1, K, M)`` h-step return samples. Computed in
            float32 (or float64 if given) whatever the input dtype.
        valid: optional bool ``(*batch, H+1)``; ``False`` gives that horizon
            zero precision. Horizon 0 is always treated as valid, so the
            posterior is always proper.
        var_floor: lower bound on ``sigma2_h`` (see :data:`VAR_FLOOR`).
        unbiased: the ``n - 1`` divisor over the ``n = K*M`` samples of each horizon
            (``var_value`` and ``var_model`` stay the population moments).

    Returns:
        A :class:`GaussianPosterior`.
    """
    _check_returns(returns)
    if returns.dtype not in (torch.float32, torch.float64):
        returns = returns.float()
    # E_m and Var_m per particle, then the law of total variance across particles.
    var_m, mean_m = torch.var_mean(returns, dim=-1, correction=0)  # (*batch, H+1, K)
    var_value = var_m.mean(-1)
    var_model, mu_h = torch.var_mean(mean_m, dim=-1, correction=0)
    var_h = var_value + var_model
    if unbiased:
        samples = returns.shape[-1] * returns.shape[-2]
        var_h = var_h * (samples / (samples - 1))
    var_h = var_h.clamp_min(var_floor)
    precision = var_h.reciprocal()
    if valid is not None:
        if valid.shape != mu_h.shape:
            raise ValueError(
                f"valid must be a bool tensor of shape (*batch, H+1) = {tuple(mu_h.shape)}; "
                f"got shape {tuple(valid.shape)}."
            )
        # Horizon 0 always counts: an elementwise or (not an in-place write of a host
        # scalar, which a CUDA graph capture would freeze), keeping valid's memory layout,
        # which decides the summation order below and so the float rounding.
        horizon_0 = torch.arange(valid.shape[-1], device=valid.device) == 0
        valid = valid | horizon_0
        precision = torch.where(valid, precision, torch.zeros_like(precision))
    total_precision = precision.sum(-1)
    weights = precision / total_precision.unsqueeze(-1)
    # An invalid horizon's samples may be non-finite (a terminated rollout): a where, not
    # a 0 x mu_h product, keeps them out of the mean.
    used_mu_h = mu_h if valid is None else torch.where(valid, mu_h, torch.zeros_like(mu_h))
    mean = (weights * used_mu_h).sum(-1)
    return GaussianPosterior(
        mean=mean,
        var=total_precision.reciprocal(),
        weights=weights,
        mu_h=mu_h,
        var_h=var_h,
        var_value=var_value,
        var_model=var_model,
    )


def fixed_weights(
    horizon: int,
    lmbda: float | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``(H+1,)`` fixed weights of the paper's ablation (appendix D).

    ``lmbda=None`` gives uniform ``1/(H+1)``; otherwise the lambda-weighting
    ``w_h = (1 - l) l^h / (1 - l^(H+1))`` for ``0 < l < 1``.
    """
    if lmbda is None:
        return torch.full((horizon + 1,), 1.0 / (horizon + 1), device=device)
    if not 0.0 < lmbda < 1.0:
        raise ValueError(f"lambda-weighting needs 0 < lmbda < 1; got lmbda={lmbda}.")
    h = torch.arange(horizon + 1, dtype=torch.float64, device=device)
    w = (1.0 - lmbda) * lmbda**h / (1.0 - lmbda ** (horizon + 1))
    return w.float()


def fixed_weight_moments(
    returns: torch.Tensor, weights: torch.Tensor, unbiased: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance ``(*batch,)`` of the K*M fixed-weighted returns
    (``unbiased``: the ``K*M - 1`` divisor).

    Each (k, m) sample is combined over horizons, ``sum_h w_h R_h[k, m]``, and
    the K*M combined samples give the empirical moments.

    Args:
        returns: ``(*batch, H+1, K, M)``.
        weights: ``(H+1,)`` or ``(*batch, H+1)``.
    """
    _check_returns(returns)
    combined = (returns.float() * weights[..., None, None]).sum(-3)  # (*batch, K, M)
    var, mean = torch.var_mean(combined.flatten(-2), dim=-1, correction=int(unbiased))
    return mean, var


def pooled_quantile(returns: torch.Tensor, quantile: float) -> torch.Tensor:
    """DiMVE: the ``quantile``-quantile ``(*batch,)`` of all (H+1)*K*M samples pooled.

    Uses the lower order statistic (no interpolation), the empirical
    ``inf {y : P(R <= y) >= quantile}`` of the paper's appendix D.
    """
    _check_returns(returns)
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1]; got {quantile}.")
    return torch.quantile(returns.float().flatten(-3), quantile, dim=-1, interpolation="lower")
