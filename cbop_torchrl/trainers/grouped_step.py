"""One optimizer step over parameter groups that each follow their own losses (the baselines').

``groups`` are a baseline's ``(loss keys, parameters, learning rate, every)``
(:class:`~cbop_torchrl.baselines.BaselineParts`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.trainers import OptimizationStepper, Trainer

from cbop_torchrl.trainers.checkpoint import CheckpointHook, NonFiniteLossError
from cbop_torchrl.trainers.recipes import cosine_factor


class GroupedOptimizationStepper(OptimizationStepper):
    """One Adam step where each parameter group gets the gradient of its own losses only.

    TorchRL's offline losses are meant for one optimizer per network (the
    critic loss may read the actor, the CQL penalty samples actions from it):
    summing all losses into one backward would leak critic gradients into the
    actor. Each group's loss is differentiated w.r.t. its parameters with
    ``torch.autograd.grad``; groups not due this step (TD3's delayed actor)
    get no gradient, so Adam leaves them untouched. Non-finite values stop the
    run before the update they would feed is applied (:class:`NonFiniteLossError`). With
    ``actor_schedule_steps`` the actor's group (``loss_actor``) follows IQL's cosine
    decay over that many steps (:func:`~cbop_torchrl.trainers.recipes.cosine_factor`),
    set from the step count each step, so a resumed run has the same rate.

    With ``stepped_first = (method, key)`` the step has two parts: the loss module's
    ``method`` gives the ``key`` loss, whose group steps alone; the module's forward then
    gives the other groups' losses from the updated parameters (IQL's authors step the
    value network before the actor and critics read it). The logged ``key`` is the one
    before its step.
    """

    def __init__(
        self,
        groups: list[tuple[tuple[str, ...], list[nn.Parameter], float, int]],
        checkpoint: CheckpointHook,
        algo: str,
        actor_schedule_steps: int | None = None,
        stepped_first: tuple[str, str] | None = None,
    ) -> None:
        self.groups = groups
        self.checkpoint = checkpoint
        self.algo = algo
        self.actor_schedule_steps = actor_schedule_steps
        self.stepped_first = stepped_first

    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        step = trainer._optim_count
        if self.actor_schedule_steps is not None:
            factor = cosine_factor(step, self.actor_schedule_steps)
            for (keys, _, lr, _), group in zip(
                self.groups, trainer.optimizer.param_groups, strict=True
            ):
                if keys == ("loss_actor",):
                    group["lr"] = lr * factor
        due = [g for g in self.groups if step % g[3] == 0]
        norms: list[torch.Tensor] = []
        first_losses = {}
        if self.stepped_first is not None:
            method, key = self.stepped_first
            first_losses[key] = trainer.compute_loss(sub_batch, method=method)[0]
            leading = [g for g in due if g[0] == (key,)]
            norms += self._apply(trainer, first_losses, leading, step)
            due = [g for g in due if g[0] != (key,)]
        losses = trainer.compute_loss(sub_batch)
        norms += self._apply(trainer, losses, due, step)
        grad_norm = torch.stack(norms).norm() if norms else torch.zeros(())
        scalars = {
            k: v.detach() for k, v in losses.items() if v.ndim == 0 and v.is_floating_point()
        }
        scalars.update({k: v.detach() for k, v in first_losses.items()})
        out = losses.empty()
        out.update(scalars)
        out.set("grad_norm", grad_norm.detach())
        return out

    def _apply(
        self,
        trainer: Trainer,
        losses: TensorDictBase | dict[str, torch.Tensor],
        groups: list[tuple[tuple[str, ...], list[nn.Parameter], float, int]],
        step: int,
    ) -> list[torch.Tensor]:
        """Sets each group's gradient from its losses and steps Adam; returns the grads' norms."""
        trainer.optimizer.zero_grad(set_to_none=True)
        bad = []
        norms = []
        for index, (keys, params, _, _) in enumerate(groups):
            total = sum(losses.get(key) for key in keys)
            last = index == len(groups) - 1
            grads = torch.autograd.grad(total, params, retain_graph=not last, allow_unused=True)
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad
            norms += [g.norm() for g in grads if g is not None]
            if not torch.isfinite(total):
                bad.append("+".join(keys))
        if norms and not torch.isfinite(torch.stack(norms).norm()):
            bad.append("gradient norm")
        if bad:
            trainer.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"non-finite {', '.join(bad)} at gradient step {step} of the {self.algo} "
                "baseline; that update was not applied and the run stopped. Last good "
                f"checkpoint: {self.checkpoint.describe_last()}. Lower the learning rates "
                "(agent.*_lr) and resume (the same command continues from that checkpoint)."
            )
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return norms


__all__ = ["GroupedOptimizationStepper"]
