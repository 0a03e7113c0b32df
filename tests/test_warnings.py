"""No warning a user cannot act on: TorchRL's target updaters are associated before use.

TorchRL warns "No target network updater has been associated with this loss module" when a
loss reads its target parameters before a ``SoftUpdate``/``HardUpdate`` was constructed on
it, and "Found an eps value < 0.5" for ``SoftUpdate(tau=1.0)``; the pipeline does neither.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torchrl.objectives import LossModule

from cbop_torchrl.config import FQEConfig
from cbop_torchrl.modules.actor_critic import make_qvalue_ensemble
from cbop_torchrl.objectives.pretrain import FittedQEvaluationLoss
from cbop_torchrl.trainers.pretrain import fqe_target_update


def _described(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]


def test_a_debug_run_records_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage (dynamics, BC, FQE in rounds with hard target copies, the CBOP stage with
    its rollout-dtype choice, evaluation) with every warning recorded."""
    from cbop_torchrl.apps.api import compose_config, train

    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))  # every stage trains
    cfg = compose_config(["preset=debug", "logger=none", "progress=false", "fqe.rounds=2"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = train(cfg, tmp_path / "run")
    assert results["gradient_steps"] == 40
    assert results["settings"]["rollout_choice"] is not None  # the choice read the targets
    assert _described(caught) == []

    # The report's analysis loads the same loss from the checkpoint: no warning, and the
    # associated updater leaves the stored target weights as they were.
    from cbop_torchrl.evaluation.analysis import load_cbop_loss
    from cbop_torchrl.trainers.checkpoint import CHECKPOINT_NAME, load_checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = load_cbop_loss(tmp_path / "run")[0]
        target = loss.target_qvalue_network_params.data
        silenced = [f for f in warnings.filters if f[1] and "target network" in f[1].pattern]
    assert _described(caught) == [] and silenced == []  # associated, not silenced
    stored = load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)["loss_module"]
    key = next(k for k in stored if k.startswith("target_qvalue_network_params"))
    name = key.removeprefix("target_qvalue_network_params.")
    assert torch.equal(target.get(tuple(name.split("."))), stored[key])


def test_fqe_rounds_copy_the_ensemble_exactly_without_a_warning() -> None:
    torch.manual_seed(0)
    loss = FittedQEvaluationLoss(make_qvalue_ensemble(2, 3, 2, (8,)), gamma=0.5)
    config = FQEConfig(steps=4, batch_size=8, checkpoint_interval=10, rounds=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        update = fqe_target_update(loss, config)
        for step in (1, 2, 3):  # a new round at step 2 (steps // rounds)
            with torch.no_grad():
                loss.qvalue_network_params.data.apply_(lambda p: p.add_(1.0))
            online = loss.qvalue_network_params.data.clone()
            update(step)
            target = loss.target_qvalue_network_params.data  # read: TorchRL would warn
            assert bool((target == online).all()) == (step == 2), step
    assert not [w for w in caught if LossModule.TARGET_NET_WARNING[:40] in str(w.message)]
    assert _described(caught) == []
