"""``preset=paper`` takes the authors' choices where the paper is silent (AUTHORS_SETTINGS).

The composed preset is checked against the table in :mod:`cbop_torchrl.config.paper`, which
cites the authors' file and line for each value; the CPU and debug presets keep each key's
default, today's choice.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from cbop_torchrl.cli import config_values, register_schemas
from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.config.paper import AUTHORS_SETTINGS
from cbop_torchrl.config.sections import BC_CONVERGE_FIELDS, LATER_DYNAMICS_FLAGS
from cbop_torchrl.registry import get_family, parse_d4rl_id

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "cbop_torchrl" / "configs"


def composed(*overrides: str) -> dict:
    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return config_values(compose("config", overrides=list(overrides)))


def known_dataset(env: str):
    """Stands in for the dataset layer: D4RL ids, and generated sets by their family prefix."""
    if (parsed := parse_d4rl_id(env)) is not None:
        return parsed[0], env
    if env == "demo":
        return get_family("hopper"), "hopper-demo-medium-replay-gen"
    return get_family(env.split("-")[0]), env


def loaded(*overrides: str) -> RunConfig:
    config, _ = load_config(composed(*overrides), known_dataset)
    return config


def value_at(config: RunConfig, dotted: str):
    section, _, key = dotted.partition(".")
    value = getattr(getattr(config, section), key)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def preset_keys(preset: str) -> set[str]:
    """The dotted keys a preset file sets itself."""
    values = yaml.safe_load((CONFIGS / "preset" / f"{preset}.yaml").read_text())
    return {
        f"{section}.{key}"
        for section, entries in values.items()
        if isinstance(entries, dict)
        for key in entries
    }


@pytest.mark.parametrize(
    "env", ["hopper-medium-replay-v2", "halfcheetah-medium-v2", "halfcheetah-medium-replay-gen"]
)
def test_the_paper_preset_has_every_authors_value(env: str) -> None:
    config = loaded(f"env={env}", "preset=paper")
    wrong = {
        dotted: (value_at(config, dotted), expected)
        for dotted, (expected, _) in AUTHORS_SETTINGS.items()
        if value_at(config, dotted) != expected
    }
    assert not wrong, f"preset=paper differs from the authors' values (got, expected): {wrong}"
    # The paper's own sizes still come from its table.
    assert config.agent.num_qvalue_nets == (50 if env.startswith("hopper") else 20)
    assert config.dynamics.num_members == 30 and config.estimator.horizon == 10


def test_every_row_cites_a_file_and_line_of_the_authors_code() -> None:
    citation = re.compile(r"^(README\.md|rlkit/[\w/]+\.(py|yaml)):\d+")
    for dotted, (_, source) in AUTHORS_SETTINGS.items():
        assert citation.match(source), f"{dotted}: {source!r} names no file:line"
        section, _, key = dotted.partition(".")
        assert key in {f for f in vars(getattr(RunConfig(), section))}, dotted


@pytest.mark.parametrize("preset", ["cpu", "debug"])
def test_the_cpu_and_debug_presets_keep_todays_choices(preset: str) -> None:
    config, defaults = loaded(f"preset={preset}"), RunConfig()
    own = preset_keys(preset)
    for dotted in AUTHORS_SETTINGS:
        if dotted not in own:
            assert value_at(config, dotted) == value_at(defaults, dotted), (preset, dotted)
    # None of the authors' opt-ins is on, so the run's hash is the one from before them.
    training = config.training_dict()
    assert not set(BC_CONVERGE_FIELDS) & set(training["bc"])
    assert not set(LATER_DYNAMICS_FLAGS) & set(training["dynamics"])
    assert "unbiased_variance" not in training["estimator"]
    assert "drop_terminal" not in training["fqe"]


def test_the_paper_presets_run_hash_names_the_authors_options() -> None:
    training = loaded("env=hopper-medium-v2", "preset=paper").training_dict()
    assert training["bc"]["converge"] is True and training["fqe"]["drop_terminal"] is True
    assert training["dynamics"]["shared_logvar_bounds"] is True
    assert training["dynamics"]["bootstrap_per_epoch"] is True
    assert training["estimator"]["unbiased_variance"] is True


def test_a_non_boolean_dynamics_flag_is_refused() -> None:
    from cbop_torchrl.config import DynamicsConfig

    with pytest.raises(ValueError, match="bootstrap_per_epoch"):
        DynamicsConfig(bootstrap_per_epoch="yes")
