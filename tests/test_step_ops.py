"""The CBOP step dispatches few operations and computes the same numbers as before its cuts.

The references are the step as it was before its operations were cut
(``benchmarks.speed.step_ops.OPS_BASE_COMMIT``, 1,800 operations at the paper's sizes, and
``OPS_CUT_COMMIT``, 1,544), its modules loaded from git: the same losses, diagnostics and
parameters, bit for bit, with fp32 and with bf16 rollouts, the beyond-the-paper terms on.
The operation counts are held to ceilings at the paper's structure (K, M, H, the layers,
the task and the Q-ensemble's row blocks; a small batch and small widths, which change no
operation). Without git (an installed copy) the comparisons are skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.speed import step_ops
from benchmarks.speed.models import build_models
from benchmarks.speed.sizes import PAPER, PAPER_HOPPER, TINY
from benchmarks.speed.step_ops import (
    OPS_BASE_COMMIT,
    OPS_CUT_COMMIT,
    count_ops,
    current_modules,
    load_step_modules,
    make_step,
    op_structure,
    timed_dtypes,
)

SIZE = dataclasses.replace(TINY, batch=32, horizon=4, particles=3, members=4)
#: Ceilings: operations per bf16 step at the paper's structure (walker2d M = 20, hopper
#: M = 50), with a CPU's Q-ensemble blocks (7 at these sizes) and a CUDA run's (1). A change
#: that adds operations to the step fails here; one that removes some lowers them.
CEILINGS = {
    ("M20", "cpu"): 1230,
    ("M20", "cuda"): 1145,
    ("M50", "cpu"): 1310,
    ("M50", "cuda"): 1225,
}

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


@pytest.fixture(scope="module", params=[OPS_BASE_COMMIT, OPS_CUT_COMMIT])
def base_modules(request):
    modules = load_step_modules(request.param)
    if modules is None:
        pytest.skip(f"git cannot show {request.param} here")
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
        # Two row blocks: the chunked Q-ensemble runs too.
        loss, step = make_step(modules, SIZE, torch.device("cpu"), rollout_dtype, models, 200)
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
    base_state, state = base_step.optimizer.state_dict(), step.optimizer.state_dict()
    assert base_state["param_groups"] == state["param_groups"]
    for index, moments in base_state["state"].items():
        for name, value in moments.items():
            assert torch.equal(state["state"][index][name], value), (index, name)


@pytest.mark.parametrize("paper", [PAPER, PAPER_HOPPER], ids=["M20", "M50"])
def test_the_paper_step_dispatches_at_most_its_ceiling(paper) -> None:
    size, chunks = op_structure(paper)
    models = build_models(size, torch.device("cpu"))
    name = "M20" if paper is PAPER else "M50"
    for device, rows in chunks.items():
        count = count_ops(current_modules(), size, rows, models)
        assert count <= CEILINGS[name, device], (name, device, count)


def test_the_count_does_not_depend_on_batch_or_widths() -> None:
    """op_structure's premise: a larger batch and wider layers with the same blocks."""
    counts = []
    for batch, width in ((8, 16), (24, 48)):
        size, chunks = op_structure(dataclasses.replace(PAPER, horizon=3), batch, width)
        models = build_models(size, torch.device("cpu"))
        counts.append(count_ops(current_modules(), size, chunks["cpu"], models))
    assert counts[0] == counts[1], counts


def test_the_step_dispatches_fewer_operations_than_before(base_modules) -> None:
    size, chunks = op_structure(dataclasses.replace(PAPER, horizon=3))
    models = build_models(size, torch.device("cpu"))
    before = count_ops(base_modules, size, chunks["cpu"], models)
    now = count_ops(current_modules(), size, chunks["cpu"], models)
    assert now <= 0.9 * before, (before, now)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_is_timed_only_where_the_cpu_multiplies_it_natively(monkeypatch, capsys, native):
    reason = "a CPU with AVX512-BF16" if native else "a CPU without AMX-BF16 or AVX512-BF16"
    monkeypatch.setattr(step_ops, "native_bf16_matmul", lambda device: (native, reason))
    cpu = torch.device("cpu")
    expected = ("float32", "bfloat16") if native else ("float32",)
    assert timed_dtypes(cpu, force_bf16=False) == expected
    assert timed_dtypes(cpu, force_bf16=True) == ("float32", "bfloat16")
    assert ("not timed" in capsys.readouterr().out) is not native
