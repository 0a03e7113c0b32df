"""Every ``estimator.*`` setting of a run reaches the estimator that ``cbop-train`` builds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_config import composed, known_dataset

from cbop_torchrl.config import load_config
from cbop_torchrl.config.sections import EstimatorConfig
from cbop_torchrl.trainers import cbop_stage

#: Keys the stage resolves before the estimator sees them (``auto`` picks a dtype later).
RESOLVED_LATER = {"rollout_dtype"}


class Built(Exception):
    """Raised by the recording CBOPLoss: the arguments are all the test needs."""


@pytest.mark.parametrize("flip", [False, True])
def test_every_estimator_setting_reaches_the_cbop_loss(
    monkeypatch: pytest.MonkeyPatch, flip: bool
) -> None:
    overrides = ["env=demo", "preset=debug"]
    if flip:
        overrides += ["estimator.unbiased_variance=true", "estimator.sampling=independent"]
    config, _ = load_config(composed(*overrides), known_dataset)
    seen: dict[str, Any] = {}

    def recording_loss(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        seen.update(kwargs.get("estimator_kwargs") or {})
        raise Built

    monkeypatch.setattr(cbop_stage, "CBOPLoss", recording_loss)
    info = type("Info", (), {"obs_dim": 3, "action_dim": 2})()
    with pytest.raises(Built):
        cbop_stage.build_cbop_loss(config, info, dynamics=None, device="cpu")
    for field in dataclasses.fields(EstimatorConfig):
        assert field.name in seen, f"estimator.{field.name} never reaches the CBOP loss"
        if field.name not in RESOLVED_LATER:
            assert seen[field.name] == getattr(config.estimator, field.name), field.name
