"""GPU readiness without a GPU: the CBOP update stays on the configured device.

``device=cuda`` must run the whole update on the GPU: the replay buffer's storage
there, every tensor the update touches there, no host transfers per step. These
tests run the real pipeline (debug sizes) on the configured device (CPU here, CUDA
too where present) and watch every tensor of every CBOP gradient step with a
``TorchDispatchMode``. During the step torch's *default* device is set to
``meta``, so a tensor made without an explicit device (``torch.zeros(n)``), which
on a GPU run would land on the CPU, shows up as a ``meta`` tensor or a device
error here.
"""

from __future__ import annotations

import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from test_config import composed
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torchrl.trainers import Trainer

from benchmarks.speed.host_syncs import HostSyncCounter
from cbop_torchrl.config import load_config
from cbop_torchrl.data import load_dataset_with_info, make_replay_buffer
from cbop_torchrl.trainers import cbop_stage, offline

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class DeviceAudit(TorchDispatchMode):
    """Records every tensor (input or output of an aten op) that is not on ``device``.

    0-dim CPU tensors are Python scalars wrapped by torch (``x * 0.5``); CUDA
    kernels take them as arguments without a copy, so they are not counted.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.foreign: dict[tuple[str, str], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for value in tree_flatten((args, kwargs, out))[0]:
            if not isinstance(value, torch.Tensor) or value.device == self.device:
                continue
            if value.device.type == "cpu" and value.dim() == 0:
                continue
            key = (func.name(), str(value.device))
            self.foreign[key] = self.foreign.get(key, 0) + 1
        return out


def resolved(device: str) -> torch.device:
    """``device`` as tensors report it: ``"cuda"`` is ``cuda:0`` (the current device) there."""
    return torch.empty(0, device=device).device


def test_the_audit_sees_a_tensor_made_without_a_device():
    audit = DeviceAudit(torch.device("cpu"))
    with torch.device("meta"), audit:
        torch.zeros(3)
        torch.ones(2, device="cpu") * 0.5
    assert audit.foreign == {("aten::zeros", "meta"): 1}


@pytest.mark.parametrize("device", DEVICES)
def test_replay_buffer_storage_and_batches_live_on_the_requested_device(device):
    data = load_dataset_with_info("demo")[0][:64]
    for target in (device, "meta"):  # meta: a device other than the data's, even on CPU
        buffer = make_replay_buffer(data, 8, device=target, seed=None if target == "meta" else 0)
        expected = resolved(target)
        assert buffer.storage.device == expected
        stored = buffer.storage._storage
        assert {value.device for value in stored.values(True, True)} == {expected}
        batch = buffer.sample()
        assert {value.device for value in batch.values(True, True)} == {expected}


@pytest.mark.filterwarnings("ignore:No target network updater")
@pytest.mark.parametrize("device", DEVICES)
def test_cbop_update_stays_on_the_configured_device(tmp_path, monkeypatch, device):
    dataset = write_d4rl_hdf5(
        tmp_path / "hopper-medium-replay-tiny.hdf5",
        episode_lengths=[60] * 5,
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
    )
    steps, log_interval = 12, 5
    values = composed(
        "preset=debug",
        f"env={dataset}",
        f"device={device}",
        "logger=none",
        "progress=false",
        "bc.steps=4",
        "fqe.steps=4",
        "train.epochs=1",
        f"train.steps_per_epoch={steps}",
        f"train.log_interval={log_interval}",
        f"train.checkpoint_interval={steps}",
        "eval.episodes=1",
        "eval.max_steps=5",
        "eval.interval=0",
    )
    data, info = load_dataset_with_info(dataset)
    config, _ = load_config(values, lambda env: (info.family, info.name))
    configured = resolved(device)

    buffers = []

    def recording_buffer(*args, **kwargs):
        buffers.append(make_replay_buffer(*args, **kwargs))
        return buffers[-1]

    monkeypatch.setattr(cbop_stage, "make_replay_buffer", recording_buffer)
    foreign: dict[int, dict[tuple[str, str], int]] = {}  # per step: the audit's findings
    syncs: dict[int, int] = {}
    optim_steps = Trainer.optim_steps

    def audited_optim_steps(trainer, batch):
        step = trainer.collected_frames
        torch.set_default_device("meta")
        try:
            with HostSyncCounter() as counter, DeviceAudit(configured) as audit:
                return optim_steps(trainer, batch)
        finally:
            torch.set_default_device(None)
            syncs[step] = counter.count
            foreign[step] = audit.foreign

    monkeypatch.setattr(Trainer, "optim_steps", audited_optim_steps)
    results = offline.run_pipeline(config, info, data, tmp_path / "run")

    assert results["gradient_steps"] == steps and len(syncs) == steps
    # Nothing leaves the device, except the metrics read every log_interval steps (on CUDA
    # one copy to the host; on the CPU no copy at all).
    # The finiteness record is read at every log_interval-th step of the stage, counted
    # from its first (the Trainer has counted a step's frame before it optimises).
    logged = {step for call, step in enumerate(foreign, 1) if call % log_interval == 0}
    stray = {step: found for step, found in foreign.items() if found and step not in logged}
    assert not stray, f"tensors off the device at steps that read no metrics: {stray}"
    assert all(set(foreign[step]) <= {("aten::_to_copy", "cpu")} for step in logged), foreign
    assert buffers[-1].storage.device == configured  # the CBOP stage's buffer
    stored = buffers[-1].storage._storage.values(True, True)
    assert {value.device for value in stored} == {configured}
    # No host transfer per step: at most one sync (the finiteness check), more only
    # where the metrics are read (every log_interval steps).
    quiet = {step: count for step, count in syncs.items() if step not in logged}
    assert max(quiet.values()) <= 1, syncs
