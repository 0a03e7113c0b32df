"""gaussian_posterior and the fixed/quantile reductions against the paper's equations."""

from __future__ import annotations

import pytest
import torch

from cbop_torchrl.objectives.posterior import (
    VAR_FLOOR,
    fixed_weight_moments,
    fixed_weights,
    gaussian_posterior,
    pooled_quantile,
)


def loop_posterior(returns: torch.Tensor, valid: torch.Tensor | None = None):
    """Paper eqs. (4)-(6) written as plain loops over one batch element at a time."""
    batch, horizons, particles, members = returns.shape
    out = []
    for b in range(batch):
        mu_h, var_h, a_h, b_h = [], [], [], []
        for h in range(horizons):
            per_particle_mean, per_particle_var = [], []
            for k in range(particles):
                samples = [float(returns[b, h, k, m]) for m in range(members)]
                mean_k = sum(samples) / members
                per_particle_mean.append(mean_k)
                per_particle_var.append(sum((x - mean_k) ** 2 for x in samples) / members)
            mu = sum(per_particle_mean) / particles
            a = sum(per_particle_var) / particles
            bb = sum((x - mu) ** 2 for x in per_particle_mean) / particles
            mu_h.append(mu)
            a_h.append(a)
            b_h.append(bb)
            var_h.append(max(a + bb, VAR_FLOOR))
        rho = [1.0 / v for v in var_h]
        if valid is not None:
            rho = [r if (h == 0 or bool(valid[b, h])) else 0.0 for h, r in enumerate(rho)]
        total = sum(rho)
        weights = [r / total for r in rho]
        mean = sum(w * m for w, m in zip(weights, mu_h, strict=True))
        out.append((mean, 1.0 / total, weights, mu_h, var_h, a_h, b_h))
    return out


def assert_matches_loop(post, expected):
    for b, (mean, var, weights, mu_h, var_h, a_h, b_h) in enumerate(expected):
        torch.testing.assert_close(post.mean[b].item(), mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(post.var[b].item(), var, rtol=1e-9, atol=1e-12)
        for name, ref in [
            ("weights", weights),
            ("mu_h", mu_h),
            ("var_h", var_h),
            ("var_value", a_h),
            ("var_model", b_h),
        ]:
            got = getattr(post, name)[b]
            torch.testing.assert_close(got, torch.tensor(ref, dtype=got.dtype), msg=name)


def random_returns(seed: int, shape=(5, 4, 3, 6)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Per-horizon scales differ so the weights are far from uniform.
    scale = torch.linspace(0.3, 3.0, shape[1], dtype=torch.float64)[:, None, None]
    return 10 + scale * torch.randn(shape, generator=gen, dtype=torch.float64)


def test_matches_loop_implementation():
    returns = random_returns(0)
    post = gaussian_posterior(returns)
    assert post.mean.shape == (5,) and post.weights.shape == (5, 4)
    assert_matches_loop(post, loop_posterior(returns))


def test_matches_loop_implementation_with_valid_mask():
    returns = random_returns(1)
    gen = torch.Generator().manual_seed(2)
    valid = torch.rand(5, 4, generator=gen) > 0.5
    valid[0, 0] = False  # horizon 0 must count as valid regardless
    post = gaussian_posterior(returns, valid)
    assert_matches_loop(post, loop_posterior(returns, valid))
    assert torch.all(post.weights[~valid.clone().index_fill_(1, torch.tensor([0]), True)] == 0)
    assert post.weights[0, 0] > 0


def test_valid_mask_shape_is_checked():
    with pytest.raises(ValueError, match="valid must be"):
        gaussian_posterior(random_returns(0), torch.ones(5, 3, dtype=torch.bool))


def test_equal_variances_give_uniform_weights_and_h_step_average():
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(2, 1, 4, 5, generator=gen, dtype=torch.float64)
    offsets = torch.tensor([0.0, 1.0, -2.0, 5.0], dtype=torch.float64)[None, :, None, None]
    returns = base + offsets  # same spread at every horizon, different means
    post = gaussian_posterior(returns)
    torch.testing.assert_close(post.weights, torch.full((2, 4), 0.25, dtype=torch.float64))
    torch.testing.assert_close(post.mean, post.mu_h.mean(-1))


def test_huge_model_variance_puts_weight_on_h0():
    gen = torch.Generator().manual_seed(4)
    returns = torch.randn(3, 6, 4, 5, generator=gen)
    # Dynamics disagreement (a per-particle offset) only at h >= 1.
    particle_offset = 1e3 * torch.randn(3, 1, 4, 1, generator=gen)
    returns[:, 1:] += particle_offset
    post = gaussian_posterior(returns)
    assert torch.all(post.weights[:, 0] > 0.999)
    assert torch.all(post.var_model[:, 1:] > 100 * post.var_value[:, 1:])


def test_variance_floor_keeps_weights_finite():
    returns = torch.ones(2, 3, 4, 5)
    post = gaussian_posterior(returns)
    assert torch.isfinite(post.weights).all()
    torch.testing.assert_close(post.var_h, torch.full((2, 3), VAR_FLOOR))
    torch.testing.assert_close(post.mean, torch.ones(2))


def test_bf16_input_is_reduced_in_fp32():
    returns = random_returns(6).to(torch.bfloat16)
    post = gaussian_posterior(returns)
    assert post.mean.dtype == torch.float32


def test_fixed_weights():
    torch.testing.assert_close(fixed_weights(3), torch.full((4,), 0.25))
    w = fixed_weights(4, 0.5)
    torch.testing.assert_close(w.sum(), torch.tensor(1.0))
    torch.testing.assert_close(w[1:] / w[:-1], torch.full((4,), 0.5))
    with pytest.raises(ValueError, match="0 < lmbda < 1"):
        fixed_weights(3, 1.0)


def test_fixed_weight_moments_match_loop():
    returns = random_returns(7)
    w = fixed_weights(3, 0.7).double()
    mean, var = fixed_weight_moments(returns, w)
    b = 2
    samples = [
        sum(float(w[h]) * float(returns[b, h, k, m]) for h in range(4))
        for k in range(3)
        for m in range(6)
    ]
    ref_mean = sum(samples) / len(samples)
    ref_var = sum((x - ref_mean) ** 2 for x in samples) / len(samples)
    torch.testing.assert_close(mean[b].item(), ref_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(var[b].item(), ref_var, rtol=1e-5, atol=1e-6)


def test_pooled_quantile_is_an_order_statistic():
    returns = torch.arange(2 * 4 * 5, dtype=torch.float32).reshape(1, 2, 4, 5)
    torch.testing.assert_close(pooled_quantile(returns, 0.5), torch.tensor([19.0]))
    torch.testing.assert_close(pooled_quantile(returns, 1.0), torch.tensor([39.0]))
    assert pooled_quantile(returns, 0.1) < pooled_quantile(returns, 0.5)
