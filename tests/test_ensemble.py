"""Vectorized ensemble layers: batched members equal per-member reference computations."""

import pytest
import torch

from cbop_torchrl.modules.ensemble import EnsembleLinear, EnsembleMLP


def reference_mlp(mlp: EnsembleMLP, member: int, x: torch.Tensor) -> torch.Tensor:
    """Member ``member`` of ``mlp`` applied to ``x [B, in]`` one layer at a time."""
    for i, layer in enumerate(mlp.layers):
        x = x @ layer.weight[member] + layer.bias[member]
        if i < len(mlp.layers) - 1:
            x = mlp.activation(x)
    return x


def test_linear_members_are_independent_affine_maps():
    torch.manual_seed(0)
    layer = EnsembleLinear(4, 3, 5)
    x = torch.randn(4, 7, 3)
    out = layer(x)
    assert out.shape == (4, 7, 5)
    for e in range(4):
        torch.testing.assert_close(out[e], x[e] @ layer.weight[e] + layer.bias[e])
    assert not torch.allclose(layer.weight[0], layer.weight[1])


def test_shared_input_equals_expanded_per_member_input():
    torch.manual_seed(0)
    mlp = EnsembleMLP(5, 6, 4, hidden_sizes=(8, 8), activation="silu")
    x = torch.randn(9, 6)
    shared = mlp(x, per_member=False)
    assert shared.shape == (5, 9, 4)
    torch.testing.assert_close(shared, mlp(x.expand(5, 9, 6), per_member=True))
    for e in range(5):
        torch.testing.assert_close(shared[e], reference_mlp(mlp, e, x))


def test_selected_members_match_full_ensemble_rows():
    torch.manual_seed(0)
    mlp = EnsembleMLP(6, 4, 3, hidden_sizes=(8,))
    members = torch.tensor([4, 1, 5])
    x = torch.randn(3, 10, 4)  # block k goes to member members[k]
    out = mlp(x, members=members, per_member=True)
    assert out.shape == (3, 10, 3)
    for k, e in enumerate(members.tolist()):
        torch.testing.assert_close(out[k], reference_mlp(mlp, e, x[k]))
    shared = mlp(x[0], members=members, per_member=False)
    torch.testing.assert_close(shared, mlp(x[0], per_member=False)[members])


def test_mismatched_member_blocks_are_rejected():
    mlp = EnsembleMLP(4, 3, 2, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="member blocks"):
        mlp(torch.randn(3, 5, 3))
    with pytest.raises(ValueError, match="member blocks"):
        mlp(torch.randn(4, 5, 3), members=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="unknown activation"):
        EnsembleMLP(2, 3, 2, activation="swishy")


def test_gradients_reach_only_selected_members():
    mlp = EnsembleMLP(4, 3, 2, hidden_sizes=(8,))
    mlp(torch.randn(2, 5, 3), members=torch.tensor([1, 3])).sum().backward()
    grad = mlp.layers[0].weight.grad
    assert grad[[1, 3]].abs().sum() > 0
    assert grad[[0, 2]].abs().sum() == 0
