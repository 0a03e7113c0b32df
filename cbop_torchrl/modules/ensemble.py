"""Vectorized ensemble layers: every member runs in one batched matmul per layer.

The weights of ``E`` members are stacked into one ``[E, in, out]`` tensor, so a
layer is a single ``torch.baddbmm`` over the member dimension instead of a
Python loop over ``E`` ``nn.Linear`` modules. TorchRL's ``MLP``/``vmap`` route
(used for the Q-ensemble) would also work, but the dynamics ensemble needs two
things it does not give cheaply: running a *subset* of members (the elites)
by indexing the weight stack, and per-member inputs whose member dimension is
the particle dimension of a TS-infinity rollout.

Shapes (``E`` members, ``E'`` selected members, ``B`` batch):

- shared input ``[B, in]`` -> ``[E', B, out]`` (every member sees the same rows);
- per-member input ``[E', B, in]`` -> ``[E', B, out]`` (row block ``e`` goes to member ``e``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

_ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def make_activation(name: str) -> nn.Module:
    """An activation module by name (``silu``, ``relu``, ``tanh``, ``elu``)."""
    try:
        return _ACTIVATIONS[name.lower()]()
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}"
        ) from None


class EnsembleLinear(nn.Module):
    """``E`` independent affine maps ``x @ W_e + b_e`` evaluated in one ``baddbmm``.

    Each member is initialised like ``nn.Linear`` (Kaiming-uniform weights,
    uniform bias), independently of the others.

    Args:
        num_members: ``E``.
        in_features: input size ``in``.
        out_features: output size ``out``.
    """

    def __init__(self, num_members: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.num_members = num_members
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(num_members, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_features))
        # (key, weight, bias) of the last gathered/cast member subset, see member_params.
        self._selected_cache: tuple | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Same distribution as nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for W and b.
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def member_params(
        self, members: torch.Tensor | None = None, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight [E', in, out], bias [E', 1, out])`` of the selected members (all if None).

        With ``dtype`` the copies are cast to it. Outside autograd (rollouts)
        the gathered/cast copies are cached and reused until the parameters
        change: the key holds the parameters' storage and version counter,
        which every in-place update (optimizer step, ``load_state_dict``,
        ``copy_``) and every ``.to()`` changes, and the ``members`` tensor's.
        """
        if members is None and dtype in (None, self.weight.dtype):
            return self.weight, self.bias
        building_graph = torch.is_grad_enabled() and self.weight.requires_grad
        key = None
        # Under torch.compile the gathered copies are part of the graph: no cache to key.
        if not building_graph and not torch.compiler.is_compiling():
            key = (
                self.weight.data_ptr(),
                self.weight._version,
                self.bias.data_ptr(),
                self.bias._version,
                None if members is None else (members.data_ptr(), members._version),
                None if members is None else tuple(members.shape),
                dtype,
            )
            if self._selected_cache is not None and self._selected_cache[0] == key:
                return self._selected_cache[1], self._selected_cache[2]
        weight, bias = self.weight, self.bias
        if members is not None:
            weight, bias = weight.index_select(0, members), bias.index_select(0, members)
        if dtype is not None:
            weight, bias = weight.to(dtype), bias.to(dtype)
        if key is not None:
            self._selected_cache = (key, weight, bias)
        return weight, bias

    def forward(
        self, x: torch.Tensor, members: torch.Tensor | None = None, per_member: bool = True
    ) -> torch.Tensor:
        """Applies the selected members.

        Args:
            x: ``[E', B, in]`` if ``per_member`` else ``[B, in]`` (shared by all members).
            members: ``[E']`` long indices of the members to run; None runs all ``E``.
            per_member: whether ``x`` carries a leading member dimension.

        Returns:
            ``[E', B, out]``.
        """
        device_type = x.device.type
        dtype = None
        if torch.is_autocast_enabled(device_type):
            # Cast the (cached) weights once instead of letting autocast recast them per call.
            dtype = torch.get_autocast_dtype(device_type)
        weight, bias = self.member_params(members, dtype)
        if not per_member:
            x = x.unsqueeze(0).expand(weight.shape[0], *x.shape)
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, in={self.in_features}, out={self.out_features}"


class EnsembleMLP(nn.Module):
    """An MLP ensemble: ``len(hidden_sizes)`` hidden layers, every layer one batched call.

    Args:
        num_members: ``E``.
        in_features: input size.
        out_features: output size.
        hidden_sizes: widths of the hidden layers, e.g. ``(200, 200, 200, 200)``.
        activation: name of the hidden activation (see :func:`make_activation`).
    """

    def __init__(
        self,
        num_members: int,
        in_features: int,
        out_features: int,
        hidden_sizes: tuple[int, ...] = (200, 200, 200, 200),
        activation: str = "silu",
    ) -> None:
        super().__init__()
        self.num_members = num_members
        sizes = [in_features, *hidden_sizes, out_features]
        self.layers = nn.ModuleList(
            EnsembleLinear(num_members, n_in, n_out)
            for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.activation = make_activation(activation)

    def forward(
        self, x: torch.Tensor, members: torch.Tensor | None = None, per_member: bool = True
    ) -> torch.Tensor:
        """``x`` ``[E', B, in]`` (or shared ``[B, in]``) -> ``[E', B, out]``.

        The selected members' weights are gathered (``index_select``) and, under
        ``torch.autocast``, cast once; outside autograd these copies are cached
        until the parameters change (:meth:`EnsembleLinear.member_params`).
        With ``members=None`` in fp32 the stacks are used as they are.
        """
        if per_member and members is not None and x.shape[0] != members.shape[0]:
            raise ValueError(
                f"per-member input has {x.shape[0]} member blocks but {members.shape[0]} "
                "members were selected; they must be equal"
            )
        if per_member and members is None and x.shape[0] != self.num_members:
            raise ValueError(
                f"per-member input has {x.shape[0]} member blocks but the ensemble has "
                f"{self.num_members} members"
            )
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, members, per_member=per_member or i > 0)
            if i < last:
                x = self.activation(x)
        return x
