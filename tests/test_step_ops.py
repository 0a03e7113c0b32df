"""The CBOP step dispatches fewer operations and computes the same numbers.

The reference is the step as it was before its operations were cut
(``benchmarks.speed.step_ops.OPS_BASE_COMMIT``, its estimator, loss and step function
loaded from git): the same losses, diagnostics and parameters, bit for bit, with fp32
and with bf16 rollouts, the beyond-the-paper terms on. Without git (an installed copy)
those tests are skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.speed.models import build_models
from benchmarks.speed.preset_step import load_before_modules
from benchmarks.speed.size_timings import dispatched_ops
from benchmarks.speed.sizes import TINY
from benchmarks.speed.step_ops import OPS_BASE_COMMIT, STEP_MODULES, current_modules, make_step

SIZE = dataclasses.replace(TINY, batch=32, horizon=4, particles=3, members=4)

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


@pytest.fixture(scope="module")
def base_modules():
    modules = load_before_modules(OPS_BASE_COMMIT, STEP_MODULES)
    if modules is None:
        pytest.skip(f"git cannot show {OPS_BASE_COMMIT} here")
    return modules


@pytest.mark.parametrize("rollout_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("extras", [{}, {"bc_weight": 0.5, "critic_penalty": 0.5}])
def test_the_step_equals_the_step_before_its_operations_were_cut(
    base_modules, rollout_dtype: str, extras: dict
) -> None:
    models = build_models(SIZE, torch.device("cpu"))
    batch = models[3]
    steps = []
    for modules in (base_modules, current_modules()):
        loss, step = make_step(modules, SIZE, torch.device("cpu"), rollout_dtype, models)
        loss.bc_weight = extras.get("bc_weight", 0.0)
        loss.critic_penalty = extras.get("critic_penalty", 0.0)
        steps.append((loss, step))
    (base_loss, base_step), (loss, step) = steps
    for seed in range(3):
        torch.manual_seed(seed)
        expected = base_step(batch.clone())
        torch.manual_seed(seed)
        got = step(batch.clone())
        assert set(got.keys(True, True)) == set(expected.keys(True, True))
        for key, value in expected.items(True, True):
            assert torch.equal(got.get(key), value), (seed, key)
    for key, value in base_loss.state_dict().items():
        assert torch.equal(loss.state_dict()[key], value), key


def test_the_step_dispatches_fewer_operations_than_before(base_modules) -> None:
    models = build_models(SIZE, torch.device("cpu"))
    batch = models[3]
    counts = []
    for modules in (base_modules, current_modules()):
        _, step = make_step(modules, SIZE, torch.device("cpu"), "bfloat16", models)
        counts.append(dispatched_ops(lambda step=step: step(batch)))
    before, now = counts
    assert now <= 0.9 * before, counts
