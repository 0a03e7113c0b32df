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
    run before any parameter changes (:class:`NonFiniteLossError`). With
    ``actor_schedule_steps`` the actor's group (``loss_actor``) follows IQL's cosine
    decay over that many steps (:func:`~cbop_torchrl.trainers.recipes.cosine_factor`),
    set from the step count each step, so a resumed run has the same rate.
    """

    def __init__(
        self,
        groups: list[tuple[tuple[str, ...], list[nn.Parameter], float, int]],
        checkpoint: CheckpointHook,
        algo: str,
        actor_schedule_steps: int | None = None,
    ) -> None:
        self.groups = groups
        self.checkpoint = checkpoint
        self.algo = algo
        self.actor_schedule_steps = actor_schedule_steps

    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        losses = trainer.compute_loss(sub_batch)
        step = trainer._optim_count
        if self.actor_schedule_steps is not None:
            factor = cosine_factor(step, self.actor_schedule_steps)
            for (keys, _, lr, _), group in zip(
                self.groups, trainer.optimizer.param_groups, strict=True
            ):
                if keys == ("loss_actor",):
                    group["lr"] = lr * factor
        trainer.optimizer.zero_grad(set_to_none=True)
        due = [g for g in self.groups if step % g[3] == 0]
        bad = []
        norms = []
        for index, (keys, params, _, _) in enumerate(due):
            total = sum(losses.get(key) for key in keys)
            last = index == len(due) - 1
            grads = torch.autograd.grad(total, params, retain_graph=not last, allow_unused=True)
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad
            norms += [g.norm() for g in grads if g is not None]
            if not torch.isfinite(total):
                bad.append("+".join(keys))
        grad_norm = torch.stack(norms).norm() if norms else torch.zeros(())
        if not torch.isfinite(grad_norm):
            bad.append("gradient norm")
        if bad:
            trainer.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"non-finite {', '.join(bad)} at gradient step {step} of the {self.algo} "
                "baseline; the step was not applied and the run stopped. Last good checkpoint: "
                f"{self.checkpoint.describe_last()}. Lower the learning rates (agent.*_lr) and "
                "resume (the same command continues from that checkpoint)."
            )
        trainer.optimizer.step()
        scalars = {
            k: v.detach() for k, v in losses.items() if v.ndim == 0 and v.is_floating_point()
        }
        out = losses.empty()
        out.update(scalars)
        out.set("grad_norm", grad_norm.detach())
        return out


__all__ = ["GroupedOptimizationStepper"]
