"""Host synchronisations per CBOP gradient step: at most one outside log steps.

A GPU run stalls at every ``.item()``/``bool(tensor)``/device-to-host copy;
:class:`HostSyncCounter` counts the same calls on CPU. The step here is the
CBOP stage's own: TorchRL's ``Trainer`` with the project's replay-buffer
sampling, guarded optimizer step (fused Adam), target update and metrics hook,
on a real dynamics ensemble. Counted over ``Trainer.optim_steps`` (the
update: batch sampling, loss, backward, finiteness check, Adam, target update,
metrics). Outside it, TorchRL's ``Trainer.train`` reads its frame count with
``torch.tensor(batch.numel()).sum().item()`` once per step, on a CPU tensor it
builds from a Python int: a host-only read that never waits for a GPU.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import SoftUpdate
from torchrl.trainers import TargetNetUpdaterHook, Trainer

from benchmarks.speed.host_syncs import HostSyncCounter
from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.objectives.cbop_update import cbop_update
from cbop_torchrl.trainers.cbop_stage import GuardedOptimizationStepper
from cbop_torchrl.trainers.hooks import GradientSteps, SampleFromBuffer
from cbop_torchrl.trainers.logging import MetricsHook

OBS, ACT = 5, 2


class _NoCheckpoint:
    def describe_last(self) -> str:
        return "none"


def _dataset(n: int = 64) -> TensorDict:
    obs = torch.randn(n, OBS)
    return TensorDict(
        {
            "observation": obs,
            "action": torch.rand(n, ACT) * 2 - 1,
            ("next", "observation"): obs + 0.01 * torch.randn(n, OBS),
            ("next", "reward"): torch.randn(n, 1),
            ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
        },
        batch_size=[n],
    )


def _trainer(
    total_steps: int, log_interval: int, device: torch.device, page: bool = False, check: int = 1
):
    """The stage's Trainer; ``page``: its step is ``cbop_update`` (the CBOP stage's), else the
    generic ``GradientStep`` with a ``post_optim`` target update."""
    torch.manual_seed(0)
    ensemble = GaussianEnsemble(OBS, ACT, num_members=4, hidden_sizes=(16, 16)).to(device)
    dynamics = DynamicsModel(ensemble, "none", elites=[0, 2, 3])
    loss = CBOPLoss(
        make_actor(OBS, ACT, (16,), device=device),
        make_qvalue_ensemble(3, OBS, ACT, (16,), device=device),
        dynamics,
        action_spec=action_spec(ACT, device),
        horizon=2,
    ).to(device)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3, fused=True)
    target = SoftUpdate(loss, tau=0.005)
    update = partial(cbop_update, loss, optimizer, target) if page else None
    trainer = Trainer(
        collector=GradientSteps(),
        total_frames=total_steps,
        frame_skip=1,
        optim_steps_per_batch=1,
        loss_module=loss,
        optimizer=optimizer,
        optimization_stepper=GuardedOptimizationStepper(
            _NoCheckpoint(), update=update, check_interval=check
        ),
        logger=None,
        progress_bar=False,
        auto_log_optim_steps=False,
        log_interval=log_interval,
    )
    buffer = make_replay_buffer(_dataset(), batch_size=16, device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    buffer.set_rng(generator)
    SampleFromBuffer(buffer, generator).register(trainer)
    if not page:
        trainer.register_op("post_optim", TargetNetUpdaterHook(target))
    metrics = MetricsHook(None, log_interval)
    metrics.register(trainer)
    counter = HostSyncCounter()
    optim_steps = trainer.optim_steps

    def counted_optim_steps(batch):
        with counter:
            return optim_steps(batch)

    trainer.optim_steps = counted_optim_steps
    return trainer, metrics, counter


@pytest.mark.filterwarnings("ignore:No target network updater")
@pytest.mark.parametrize("page", [False, True], ids=["gradient-step", "cbop-update"])
def test_at_most_one_host_sync_per_gradient_step_outside_log_steps(page):
    steps = 6
    trainer, metrics, counter = _trainer(steps, 1000, torch.device("cpu"), page=page)
    trainer.train()
    assert trainer.collected_frames == steps
    assert metrics._count == steps  # every step's metrics were accumulated (on the device)
    # The guarded step's finiteness check is the one sync per step.
    assert counter.count <= steps, counter.by_op


@pytest.mark.filterwarnings("ignore:No target network updater")
def test_metrics_are_read_once_per_log_interval():
    trainer, metrics, counter = _trainer(4, log_interval=2, device=torch.device("cpu"))
    trainer.train()
    assert counter.count <= 4 + 2, counter.by_op  # one per step + one read per interval
    assert {"loss_actor", "cbop/weights/0", "cbop/weights/2", "grad_steps_per_s"} <= set(
        metrics.last_window
    )


def test_the_cbop_update_makes_no_host_sync_between_checks():
    """The page's step, as a CUDA graph captures it: nothing read on the host."""
    steps = 6
    trainer, _, counter = _trainer(steps, 1000, torch.device("cpu"), page=True, check=1000)
    trainer.train()
    assert trainer.collected_frames == steps
    assert counter.count == 0, counter.by_op


def test_counter_sees_item_bool_and_boolean_masks():
    x = torch.arange(4.0)
    with HostSyncCounter() as counter:
        x.sum().item()
        bool(x.max() > 1)
        x[x > 1]
        x.nonzero()
        x * 2  # no sync
    assert counter.by_op["aten::_local_scalar_dense"] == 2
    assert counter.count >= 4
