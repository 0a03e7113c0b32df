"""One gradient step as a plain function of a batch, which a CUDA graph can capture.

:class:`GradientStep` is the whole update of an SAC-style loss: the losses,
backward, the gradient norm, the optimizer step and the target-network
update, written so that nothing in it needs the host: whether the step was
finite is a device flag, a fused optimizer skips a non-finite step on that
flag (``found_inf``, the mechanism ``torch.amp.GradScaler`` uses), and the
flag is accumulated on the device in a :class:`StepHealth` that the caller
reads when it chooses (every step on a CPU, where reading costs nothing;
every log interval on a GPU).

:class:`~cbop_torchrl.accel.CapturedStep` records such a function once as a CUDA graph
and replays it.

Shapes: the batch is a TensorDict with batch ``[B]``; the returned losses are a
TensorDict with batch ``[]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor

from cbop_torchrl.objectives.cbop_update import Guard, polyak_update


def supports_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` skips itself on ``optimizer.found_inf`` (fused Adam/AdamW/SGD).

    ``torch.amp.GradScaler`` sets ``grad_scale``/``found_inf`` attributes on a fused
    optimizer, whose kernel then leaves parameters, moments and step count unchanged
    where ``found_inf`` is nonzero: a skip decided on the device, without a host read.
    """
    fused = bool(optimizer.defaults.get("fused"))
    return fused and isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD))


class StepHealth:
    """Device-side record of non-finite steps: counters a CUDA graph can update.

    Attributes (all on the device):
        steps: ``[]`` int64, steps run since the record was made.
        bad_steps: ``[]`` int64, steps whose losses, target or gradient were not finite.
        first_bad: ``[]`` int64, the index (in ``steps``) of the first such step, -1 if none.
        first_bad_keys: ``[n_keys]`` bool, which checked values were not finite at that step.
    """

    def __init__(self, device: torch.device) -> None:
        self.steps = torch.zeros((), dtype=torch.int64, device=device)
        self.bad_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.first_bad_keys: Tensor | None = None
        self.keys: list[str] = []

    def record(self, finite_by_key: Tensor, keys: list[str]) -> Tensor:
        """Adds a step; ``finite_by_key`` ``[n_keys]`` bool. Returns ``[]`` bool: it was bad."""
        if self.first_bad_keys is None:  # the first (eager) call fixes the keys
            self.keys = list(keys)
            self.first_bad_keys = torch.zeros_like(finite_by_key)
        bad = ~finite_by_key.all()
        is_first = bad & (self.first_bad < 0)
        # In place through out= (an elementwise operation may write over its own input).
        torch.where(is_first, self.steps, self.first_bad, out=self.first_bad)
        torch.where(is_first, ~finite_by_key, self.first_bad_keys, out=self.first_bad_keys)
        self.bad_steps.add_(bad)
        self.steps.add_(1)
        return bad

    def read(self) -> tuple[int, int, list[str]]:
        """``(bad_steps, first_bad, names)`` on the host: one synchronisation."""
        values = torch.stack([self.bad_steps, self.first_bad]).tolist()
        names = []
        if values[0] and self.first_bad_keys is not None:
            flags = self.first_bad_keys.tolist()
            names = [key for key, flag in zip(self.keys, flags, strict=True) if flag]
        return int(values[0]), int(values[1]), names


#: ``target_update.step()``, a ``SoftUpdate`` as one ``torch._foreach_lerp_`` (the page's).
target_step = polyak_update


class GradientStep:
    """One update of ``loss`` on a batch: ``losses -> backward -> optimizer step -> target update``.

    Args:
        loss: a TorchRL loss module whose output's ``loss_*`` keys are summed.
        optimizer: its optimizer. With a fused one (:func:`supports_found_inf`) a
            non-finite step is skipped on the device; otherwise call
            :meth:`forward_backward`, read :attr:`health`, then :meth:`apply`.
        target_update: a TorchRL ``TargetNetUpdater`` (``SoftUpdate``) stepped after
            the optimizer, or None.
        update: the whole step as a function ``update(batch, guard) -> losses`` that
            calls ``guard(losses, grad_norm)`` between its backward and its optimizer
            step (the CBOP stage's :func:`~cbop_torchrl.objectives.cbop_update.cbop_update`,
            bound to its loss, optimizer and target updater); None: the steps below.

    Calling it runs ``zero_grad`` (``set_to_none``: no kernel, so inside a CUDA
    graph capture the gradients are allocated in the graph's pool and every
    replay overwrites them), :meth:`forward_backward` and :meth:`apply`, and
    returns the detached losses with ``grad_norm`` (a TensorDict, batch ``[]``). Every
    floating-point output of the loss (losses, the CBOP target's diagnostics)
    and the gradient norm are checked; :attr:`health` records the result.
    """

    def __init__(
        self,
        loss: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        target_update: object | None = None,
        update: Callable[[TensorDictBase, Guard], TensorDictBase] | None = None,
    ) -> None:
        self.loss = loss
        self.optimizer = optimizer
        self.target_update = target_update
        self.update = update
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        device = self.params[0].device
        self.health = StepHealth(device)
        self.skips_on_device = supports_found_inf(optimizer)
        if self.skips_on_device:
            # A tensor attribute the fused kernel reads: 1.0 skips the step.
            optimizer.found_inf = torch.zeros((), dtype=torch.float32, device=device)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def forward_backward(self, batch: TensorDictBase) -> TensorDictBase:
        """Losses, backward and the health record; parameters are not changed yet."""
        losses = self.loss(batch)
        terms = [value for key, value in losses.items() if key.startswith("loss_")]
        total = terms[0]
        for term in terms[1:]:  # not sum(): its 0 + the first term is one more operation
            total = total + term
        total.backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        # The total 2-norm without clip_grad_norm_'s multiply by a clip factor of 1.
        grad_norm = torch.nn.utils.get_total_norm(grads)
        self.guard(losses, grad_norm)
        # Only the losses carry a graph: the diagnostics are detached already.
        losses = losses.apply(lambda value: value.detach() if value.requires_grad else value)
        losses.set("grad_norm", grad_norm.detach())
        return losses

    def guard(self, losses: TensorDictBase, grad_norm: Tensor) -> None:
        """Records whether every floating-point value of ``losses`` and ``grad_norm`` is finite.

        On the device (:attr:`health`); a fused optimizer's ``found_inf`` then skips a bad step.
        """
        checked = {
            "/".join(key) if isinstance(key, tuple) else key: value
            for key, value in losses.items(True, True)
            if value.numel() > 0 and value.is_floating_point()
        }
        # One finiteness test for all values: a scalar as it is, a vector as the sum of
        # ``v * 0`` (0 if every element is finite, NaN otherwise: no overflow), stacked;
        # ``x * 0 == 0`` is ``isfinite(x)`` in two operations instead of four.
        with torch.no_grad():
            probes = [
                value if value.dim() == 0 else (value * 0).sum() for value in checked.values()
            ]
            finite = torch.stack([*probes, grad_norm]).mul(0).eq(0)
        bad = self.health.record(finite, [*checked, "gradient norm"])
        if self.skips_on_device:
            self.optimizer.found_inf.copy_(bad)  # 1.0 skips the step

    def apply(self) -> None:
        """The optimizer step (skipped on the device for a non-finite fused step), then targets."""
        self.optimizer.step()
        if self.target_update is not None:
            target_step(self.target_update)

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """The step (given ``update``: ``update(batch, self.guard)``)."""
        if self.update is not None:
            return self.update(batch, self.guard)
        self.zero_grad()
        losses = self.forward_backward(batch)
        self.apply()
        return losses
