"""The CBOP gradient step as one plain function (trainers/update.py), checked on the CPU.

What a CUDA graph capture needs of the step, and what can be checked without a
GPU: the function computes exactly the update the eager stepper did; it makes
no host synchronisation and builds no tensor from host data in steady state
(a capture would fail on the first, and freeze the second); a non-finite step
is skipped on the device and reported at the next read. The capture itself
(``CapturedStep``) and its equality with the eager step are in tests/test_cuda.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode
from torchrl.objectives import SoftUpdate

from benchmarks.speed.host_syncs import HostSyncCounter
from cbop_torchrl.accel import CapturedStep, CBOPLoss
from cbop_torchrl.config import ConfigError, RunConfig
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.trainers.cbop_stage import GuardedOptimizationStepper
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError
from cbop_torchrl.trainers.offline import uses_cuda_graph
from cbop_torchrl.trainers.update import GradientStep

OBS, ACT, BATCH = 5, 2, 16

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def _loss(seed: int = 0) -> CBOPLoss:
    torch.manual_seed(seed)
    ensemble = GaussianEnsemble(OBS, ACT, num_members=4, hidden_sizes=(16, 16))
    dynamics = DynamicsModel(ensemble, "hopper", elites=[0, 2, 3])
    return CBOPLoss(
        make_actor(OBS, ACT, (16,)),
        make_qvalue_ensemble(3, OBS, ACT, (16, 16)),
        dynamics,
        action_spec=action_spec(ACT, torch.device("cpu")),
        horizon=3,
    )


def _batches(steps: int) -> list[TensorDict]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        obs = torch.randn(BATCH, OBS, generator=generator)
        obs[:, 0] = 1.25  # hopper's healthy height: rollouts mostly stay alive
        out.append(
            TensorDict(
                {
                    "observation": obs,
                    "action": torch.rand(BATCH, ACT, generator=generator) * 2 - 1,
                    ("next", "observation"): obs + 0.01 * torch.randn(BATCH, OBS),
                    ("next", "reward"): torch.randn(BATCH, 1, generator=generator),
                    ("next", "terminated"): torch.zeros(BATCH, 1, dtype=torch.bool),
                },
                batch_size=[BATCH],
            )
        )
    return out


def _adam(loss: CBOPLoss) -> torch.optim.Adam:
    return torch.optim.Adam(loss.parameters(), lr=1e-3, fused=True)


def _reference_update(loss, optimizer, target_update, batch) -> None:
    """The eager stepper's update as it was written before the step became one function."""
    losses = loss(batch)
    total = sum(value for key, value in losses.items() if key.startswith("loss_"))
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, float("inf"))
    optimizer.step()
    target_update.step()


def test_the_step_function_equals_the_eager_update_bit_for_bit() -> None:
    reference, tested = _loss(), _loss()
    ref_opt, opt = _adam(reference), _adam(tested)
    ref_target, target = SoftUpdate(reference, tau=0.05), SoftUpdate(tested, tau=0.05)
    step = GradientStep(tested, opt, target)
    for i, batch in enumerate(_batches(5)):
        torch.manual_seed(100 + i)
        _reference_update(reference, ref_opt, ref_target, batch.clone())
        torch.manual_seed(100 + i)
        losses = step(batch.clone())
        assert {"loss_actor", "loss_qvalue", "loss_alpha", "grad_norm"} <= set(losses.keys())
    for key, value in reference.state_dict().items():
        assert torch.equal(value, tested.state_dict()[key]), key
    assert step.health.read() == (0, -1, [])


@pytest.mark.parametrize(("bc_weight", "critic_penalty"), [(0.0, 0.0), (1.0, 1.0)])
def test_a_step_reads_its_batch_and_never_replaces_it(
    bc_weight: float, critic_penalty: float
) -> None:
    """The batch a step is given keeps its keys and holds the same tensors with the same
    values: a captured step's static input is copied into at every call, and a tensor
    the step put there (the actor's loc/scale views, SACLoss's td_error) broke that copy."""
    loss = _loss()
    loss.bc_weight, loss.critic_penalty = bc_weight, critic_penalty
    step = GradientStep(loss, _adam(loss), SoftUpdate(loss, tau=0.05))
    for batch in _batches(2):
        before = {key: (value, value.clone()) for key, value in batch.items(True, True)}
        step(batch)
        assert set(batch.keys(True, True)) == set(before)
        for key, (tensor, values) in before.items():
            assert batch.get(key) is tensor, key
            assert torch.equal(tensor, values), key


class _HostDataAudit(TorchDispatchMode):
    """Counts tensors made from host data (``torch.tensor(x)``) and reads of device values.

    On a GPU the first is a host-to-device copy that a CUDA graph would freeze at its
    capture, the second a synchronisation a capture refuses.
    """

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.name()
        if name.startswith(("aten::lift_fresh", "aten::_local_scalar_dense", "aten::nonzero")):
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def test_a_warm_step_makes_no_host_sync_and_no_tensor_from_host_data() -> None:
    loss = _loss()
    step = GradientStep(loss, _adam(loss), SoftUpdate(loss, tau=0.05))
    batches = _batches(3)
    step(batches[0])  # lazy state (Adam's moments, the health record's keys) is made here
    with HostSyncCounter() as syncs, _HostDataAudit() as audit:
        step(batches[1])
        step(batches[2])
    assert syncs.count == 0, syncs.by_op
    assert audit.found == []


class _NanAtStep:
    """A loss ``sum(p^2)`` whose value is NaN at the given calls (0-based)."""

    def __init__(self, parameter: torch.nn.Parameter, bad_calls: set[int]) -> None:
        self.parameter, self.bad_calls, self.calls = parameter, bad_calls, 0

    def __call__(self, batch: TensorDict) -> TensorDict:
        scale = float("nan") if self.calls in self.bad_calls else 1.0
        self.calls += 1
        loss = (self.parameter**2).sum() * scale
        return TensorDict({"loss_qvalue": loss, "cbop": {"target_mean": loss.detach()}}, [])


class _Trainer:
    def __init__(self, loss, optimizer) -> None:
        self.compute_loss, self.optimizer, self.collected_frames = loss, optimizer, 40


class _Checkpoint:
    def describe_last(self) -> str:
        return "run/checkpoint.pt (gradient step 30)"


def test_a_deferred_check_skips_the_bad_step_on_the_device_and_names_it() -> None:
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([parameter], lr=0.1, fused=True)
    trainer = _Trainer(_NanAtStep(parameter, bad_calls={1}), optimizer)
    stepper = GuardedOptimizationStepper(_Checkpoint(), check_interval=4)
    values = []
    for _ in range(3):
        stepper.step(trainer, TensorDict())
        values.append(parameter.detach().clone())
    assert not torch.equal(values[0], torch.ones(3))  # step 0 applied
    assert torch.equal(values[1], values[0])  # step 1 (NaN) skipped by the fused kernel
    assert not torch.equal(values[2], values[1])  # step 2 applied
    assert int(optimizer.state[parameter]["step"]) == 2
    with pytest.raises(NonFiniteLossError) as error:
        stepper.step(trainer, TensorDict())  # the fourth call reads the record
    message = str(error.value)
    assert "at gradient step 41" in message  # the trainer was at 40 on the first call
    assert "loss_qvalue" in message and "cbop/target_mean" in message
    assert "run/checkpoint.pt (gradient step 30)" in message
    assert torch.isfinite(parameter).all()


def test_a_deferred_check_needs_a_fused_optimizer() -> None:
    parameter = torch.nn.Parameter(torch.ones(3))
    trainer = _Trainer(_NanAtStep(parameter, set()), torch.optim.SGD([parameter], lr=0.1))
    stepper = GuardedOptimizationStepper(_Checkpoint(), check_interval=10)
    with pytest.raises(ValueError, match="fused=True"):
        stepper.step(trainer, TensorDict())


def test_steps_between_checks_read_nothing_from_the_device() -> None:
    loss = _loss()
    trainer = _Trainer(loss, _adam(loss))
    stepper = GuardedOptimizationStepper(
        _Checkpoint(), SoftUpdate(loss, tau=0.05), check_interval=3
    )
    counts = []
    for batch in _batches(6):
        with HostSyncCounter() as syncs:
            stepper.step(trainer, batch)
        counts.append(syncs.count)
    assert counts[0] == 0 and counts[1] == 0 and counts[3] == 0 and counts[4] == 0, counts


def test_cuda_graph_is_chosen_on_cuda_only_and_refused_where_it_cannot_run() -> None:
    config = RunConfig()
    assert uses_cuda_graph(config, torch.device("cpu")) is False
    assert uses_cuda_graph(config, torch.device("cuda")) is True
    assert uses_cuda_graph(RunConfig(cuda_graph=False), torch.device("cuda")) is False
    # compile=true: the step's graph holds the compiled target (no CUDA graphs of its own).
    assert uses_cuda_graph(RunConfig(compile=True), torch.device("cuda")) is True
    assert uses_cuda_graph(RunConfig(cuda_graph=True, compile=True), torch.device("cuda")) is True
    assert uses_cuda_graph(RunConfig(cuda_graph=False, compile=True), torch.device("cuda")) is False
    with pytest.raises(ConfigError, match="device=cuda"):
        uses_cuda_graph(RunConfig(cuda_graph=True), torch.device("cpu"))


def test_a_captured_step_needs_a_warm_up() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        CapturedStep(lambda batch: batch, warmup_steps=0)


def test_resuming_the_step_function_from_a_state_dict_continues_exactly() -> None:
    """Two half-runs (state saved and loaded in between, a new step function) equal one run."""
    batches = _batches(6)
    whole = _loss()
    whole_step = GradientStep(whole, _adam(whole), SoftUpdate(whole, tau=0.05))
    torch.manual_seed(7)
    for batch in batches:
        whole_step(batch.clone())

    first = _loss()
    first_opt = _adam(first)
    first_step = GradientStep(first, first_opt, SoftUpdate(first, tau=0.05))
    torch.manual_seed(7)
    for batch in batches[:3]:
        first_step(batch.clone())
    saved = copy.deepcopy(
        {"loss": first.state_dict(), "opt": first_opt.state_dict(), "rng": torch.get_rng_state()}
    )
    second = _loss()  # the same dynamics model; the trained weights come from the saved state
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.normal_()
    second_opt = _adam(second)
    # The updater first (constructing one copies the online weights onto the targets).
    second_step = GradientStep(second, second_opt, SoftUpdate(second, tau=0.05))
    second.load_state_dict(saved["loss"])
    second_opt.load_state_dict(saved["opt"])
    torch.set_rng_state(saved["rng"])
    for batch in batches[3:]:
        second_step(batch.clone())
    for key, value in whole.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key


@pytest.mark.parametrize("strict", [True, False])
def test_a_failed_capture_raises_or_goes_on_eagerly(monkeypatch, strict: bool) -> None:
    """``cuda_graph=true`` (strict) raises; ``null`` warns and trains on with the eager step."""

    def no_capture(self, batch):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(CapturedStep, "capture", no_capture)
    monkeypatch.setattr(CapturedStep, "_on_side_stream", lambda self, batch: self.step(batch))
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([parameter], lr=0.1, fused=True)
    trainer = _Trainer(_NanAtStep(parameter, set()), optimizer)
    stepper = GuardedOptimizationStepper(
        _Checkpoint(), cuda_graph=True, check_interval=2, warmup_steps=2, strict_capture=strict
    )
    for _ in range(2):  # the eager warm-up
        stepper.step(trainer, TensorDict())
    if strict:
        with pytest.raises(RuntimeError, match="stream is capturing"):
            stepper.step(trainer, TensorDict())
        return
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        stepper.step(trainer, TensorDict())
    stepper.step(trainer, TensorDict())
    assert stepper.captured is None and int(optimizer.state[parameter]["step"]) == 4


def test_cuda_graph_true_on_a_cpu_run_is_refused_before_anything_runs(tmp_path) -> None:
    from cbop_torchrl.config import validate

    problems = validate(RunConfig(cuda_graph=True, device="cpu"))
    assert any("cuda_graph=true" in problem and "device=cuda" in problem for problem in problems)
    problems = validate(RunConfig(cuda_graph=True, compile=True, device="cpu"))
    assert len([problem for problem in problems if "cuda_graph" in problem]) == 1, problems
    assert not any("compile" in problem for problem in problems), problems
    assert not any("cuda_graph" in problem for problem in validate(RunConfig(device="cpu")))


def test_the_bc_and_fqe_steps_make_no_host_sync_and_no_tensor_from_host_data() -> None:
    """What the captured BC and FQE stages (``cuda_graph``) need of their steps."""
    from cbop_torchrl.objectives.pretrain import (
        ROW_KEY,
        BehaviourCloningLoss,
        FittedQEvaluationLoss,
        bootstrap_counts,
    )

    torch.manual_seed(0)
    batches = _batches(3)
    for batch in batches:
        batch.set(("next", "action"), torch.rand(BATCH, ACT) * 2 - 1)
        batch.set(ROW_KEY, torch.arange(BATCH))
    losses = {
        "bc": BehaviourCloningLoss(make_actor(OBS, ACT, (16,))),
        "fqe": FittedQEvaluationLoss(
            make_qvalue_ensemble(3, OBS, ACT, (16, 16)),
            bootstrap_weights=bootstrap_counts(3, BATCH),
        ),
    }
    for name, loss in losses.items():
        step = GradientStep(loss, torch.optim.Adam(loss.parameters(), lr=1e-3, fused=True))
        step(batches[0])
        with HostSyncCounter() as syncs, _HostDataAudit() as audit:
            step(batches[1])
            step(batches[2])
        assert syncs.count == 0, (name, syncs.by_op)
        assert audit.found == [], name
        assert step.health.read() == (0, -1, [])


def test_the_dynamics_minibatch_step_makes_no_host_sync_and_no_tensor_from_host_data() -> None:
    from cbop_torchrl.config import DynamicsConfig
    from cbop_torchrl.trainers.dynamics import minibatch_step

    torch.manual_seed(0)
    config = DynamicsConfig(num_members=4, num_elites=3, hidden_size=16, num_layers=2,
                            weight_decay=(1e-4, 1e-4, 1e-4), batch_size=8)  # fmt: skip
    ensemble = GaussianEnsemble(OBS, ACT, num_members=4, hidden_sizes=(16, 16))
    optimizer = torch.optim.Adam(ensemble.param_groups(config.weight_decay), lr=1e-3, fused=True)
    x, y = torch.randn(64, OBS + ACT), torch.randn(64, OBS + 1)
    step = minibatch_step(ensemble, optimizer, x, y, config)
    index = [TensorDict({"index": torch.randint(64, (4, 8))}, []) for _ in range(3)]
    step(index[0])
    with HostSyncCounter() as syncs, _HostDataAudit() as audit:
        out = [step(batch) for batch in index[1:]]
    assert syncs.count == 0, syncs.by_op
    assert audit.found == []
    assert all(torch.isfinite(o.get("nll")) for o in out)
