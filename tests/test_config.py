"""Config composition, the paper's settings table, and every validation error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from programs import Call, run_programs

from cbop_torchrl.apps.api import run_banner
from cbop_torchrl.cli import (
    CONFIG_SCHEMAS,
    config_values,
    describe_hydra_error,
    register_schemas,
    unknown_keys,
    wants_paper_preset,
)
from cbop_torchrl.config import (
    GENERATED_PSI,
    PAPER_PSI,
    SAME_FILE_AS,
    ConfigError,
    infer_dataset_kind,
    load_config,
    paper,
    paper_settings,
    run_name,
)
from cbop_torchrl.data import DatasetError
from cbop_torchrl.registry import d4rl_ids, get_family, parse_d4rl_id

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = str(ROOT / "cbop_torchrl" / "configs")


def composed(*overrides: str, config_name: str = "config") -> dict:
    register_schemas()
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides))
    return config_values(cfg)


def known_dataset(env: str):
    """Stands in for the dataset layer: D4RL ids and names ending in a D4RL kind exist."""
    parsed = parse_d4rl_id(env)
    if parsed is not None:
        return parsed[0], env
    if env == "demo":
        return get_family("hopper"), "hopper-demo-medium-replay-gen"
    raise DatasetError(f"unknown dataset source {env!r}")


def load(*overrides: str):
    return load_config(composed(*overrides), known_dataset)


def test_paper_table_covers_every_d4rl_id() -> None:
    for dataset_id in d4rl_ids():
        family, kind = parse_d4rl_id(dataset_id)
        settings = paper_settings(family, kind)
        if family.name == "ant":  # D4RL's ant is not in the paper: psi must be given
            assert "estimator.psi" not in settings
            continue
        assert settings["estimator.psi"] == PAPER_PSI[family.name][kind]
        assert settings["agent.num_qvalue_nets"] == (50 if family.name == "hopper" else 20)
        assert settings["estimator.horizon"] == 10
        assert (settings["dynamics.num_members"], settings["dynamics.num_elites"]) == (30, 20)
        assert settings["train.epochs"] * settings["train.steps_per_epoch"] == 1_000_000
    assert PAPER_PSI["halfcheetah"]["medium"] == 0.5 and PAPER_PSI["hopper"]["random"] == 5.0


def test_a_generated_set_takes_the_offline_choice_of_psi_and_the_table_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an offline choice that differs from hopper's table value (2), as --select would list it
    monkeypatch.setitem(GENERATED_PSI, "hopper-medium-replay-gen", 5.0)

    def generated(env: str):
        return get_family(env.split("-")[0]), env

    def psi(env: str, *overrides: str) -> float:
        config, _ = load_config(composed(f"env={env}", *overrides), generated)
        return config.estimator.psi

    assert psi("hopper-medium-replay-gen") == GENERATED_PSI["hopper-medium-replay-gen"]
    config, filled = load_config(composed("env=hopper-medium-replay-gen"), generated)
    banner = run_banner(config, "hopper-medium-replay-gen", Path("runs/x"), filled)
    last = banner.splitlines()[-1]
    assert last.startswith("[cbop] estimator.psi=5.0: this project's offline choice"), banner
    assert "paper's table" not in banner, banner  # hopper's other keys are the CPU preset's
    unlisted = "walker2d-medium-gen"  # a generated set without an offline choice
    assert unlisted not in GENERATED_PSI
    config, filled = load_config(composed(f"env={unlisted}"), generated)
    banner = run_banner(config, unlisted, Path("runs/x"), filled)
    assert banner.splitlines()[-1].startswith("[cbop] from the paper's table for walker2d")
    assert psi("hopper-medium-replay-gen", "estimator.psi=0.5") == 0.5  # given: it wins
    assert psi(unlisted) == PAPER_PSI["walker2d"]["medium"]
    assert psi("halfcheetah-medium-replay-v2") == PAPER_PSI["halfcheetah"]["medium-replay"]


def test_the_demo_file_takes_its_sets_psi(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled demo is hopper-medium-replay-gen's file, so env=demo resolves psi as that
    set does (the offline choice where one is listed, the table's otherwise)."""
    from benchmarks.set_files import DEMO_COPIES

    for name, same_as in SAME_FILE_AS.items():  # the alias is the set's repository copy
        assert DEMO_COPIES[same_as].stem == name
    monkeypatch.setitem(GENERATED_PSI, "hopper-medium-replay-gen", 3.0)
    config, filled = load("env=demo")
    assert config.estimator.psi == 3.0 and "estimator.psi" in filled
    banner = run_banner(config, "hopper-demo-medium-replay-gen", Path("runs/x"), filled)
    assert "estimator.psi=3.0: this project's offline choice" in banner.splitlines()[-1], banner
    # A copy without the set, not delitem: restoring a deleted key would move it to the
    # dict's end for the rest of this worker (the docs' generated psi lists read that order).
    listed = GENERATED_PSI.items()
    unlisted = {name: psi for name, psi in listed if name != "hopper-medium-replay-gen"}
    monkeypatch.setattr(paper, "GENERATED_PSI", unlisted)
    assert load("env=demo")[0].estimator.psi == PAPER_PSI["hopper"]["medium-replay"]


def test_the_generated_sets_psi_is_the_committed_offline_choice() -> None:
    """GENERATED_PSI lists exactly the sets whose psi_selection.json differs from the table."""
    expected = {}
    for path in sorted((ROOT / "benchmarks" / "results").glob("*-gen/psi_selection.json")):
        selection = json.loads(path.read_text())
        family, kind = path.parent.name.split("-", 1)[0], infer_dataset_kind(path.parent.name)
        chosen = selection["selected_psi"]  # null until the whole grid has scored runs
        if chosen is not None and chosen != PAPER_PSI[family][kind]:
            expected[path.parent.name] = selection["selected_psi"]
    assert GENERATED_PSI == expected


def test_dataset_kind_is_read_from_names() -> None:
    assert infer_dataset_kind("hopper-medium-replay-gen") == "medium-replay"
    assert infer_dataset_kind("walker2d-medium-expert-v2") == "medium-expert"
    assert infer_dataset_kind("mujoco/hopper/medium-v0") == "medium"
    assert infer_dataset_kind("my-own-data") is None
    assert run_name("/data/x/hopper-medium-v2.hdf5") == "hopper-medium-v2"
    assert run_name("minari:mujoco/hopper/medium-v0") == "mujoco_hopper_medium-v0"


def test_d4rl_id_selects_the_paper_preset_unless_a_preset_is_given() -> None:
    assert wants_paper_preset(["env=hopper-medium-v2"])
    assert wants_paper_preset(["--cfg", "job", "env=hopper-medium-v2,walker2d-medium-v2"])
    assert not wants_paper_preset(["env=hopper-medium-v2", "preset=cpu"])
    assert not wants_paper_preset(["env=demo"]) and not wants_paper_preset([])
    paper = composed("env=hopper-medium-v2", config_name="config_paper")
    assert paper["preset"] == "paper" and paper["train"]["epochs"] is None
    assert (
        composed("env=hopper-medium-v2", "preset=debug", config_name="config_paper")["preset"]
        == "debug"
    )


def test_paper_preset_fills_the_table_and_explicit_overrides_win() -> None:
    config, filled = load("env=walker2d-medium-replay-v2", "preset=paper")
    assert config.estimator.psi == 2.0 and config.agent.num_qvalue_nets == 20
    assert config.estimator.horizon == 10 and config.train.total_steps == 1_000_000
    assert config.dynamics.num_members == 30 and config.dynamics.num_elites == 20
    assert config.agent.critic_lr == 3e-4 and config.train.batch_size == 256
    assert "estimator.psi" in filled

    config, filled = load(
        "env=hopper-medium-v2", "preset=paper", "estimator.psi=0.7", "agent.num_qvalue_nets=7"
    )
    assert config.estimator.psi == 0.7 and config.agent.num_qvalue_nets == 7
    assert "estimator.psi" not in filled and config.estimator.horizon == 10


def test_cpu_preset_takes_psi_from_the_dataset() -> None:
    config, filled = load()
    assert config.env == "demo" and config.preset == "cpu"
    # the demo is hopper-medium-replay-gen's file: its set's offline choice
    assert filled == ["estimator.psi"]
    assert config.estimator.psi == GENERATED_PSI["hopper-medium-replay-gen"]
    assert config.dynamics.num_elites <= config.dynamics.num_members


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["estimator.psi=-1"], "estimator.psi=-1.0 must be a number >= 0"),
        (["estimator.horizon=-2"], "estimator.horizon=-2 must be an integer >= 0"),
        (["dynamics.num_elites=9", "dynamics.num_members=4"], "larger than the trained ensemble"),
        (["train.batch_size=0"], "train.batch_size=0 must be an integer >= 1"),
        (["train.steps_per_epoch=-5"], "train.steps_per_epoch=-5 must be an integer >= 1"),
        (["bc.steps=0"], "bc.steps=0 must be an integer >= 1"),
        (["env=nowhere/missing.hdf5"], "unknown dataset source"),
        (["estimator.psi=nan"], "estimator.psi=nan is not a number"),
        (["logger.project="], "logger.project is an empty string"),
        (["agent.hidden_sizes=[64,0]"], "agent.hidden_sizes=[64,0] must be a list of at least"),
        (["estimator.quantile=1.5"], "must be a number in (0, 1)"),
        (["eval.episodes=0"], "eval.episodes=0 must be an integer >= 1"),
        (["agent.bc_weight=-1"], "agent.bc_weight=-1.0 must be a number >= 0"),
        (["agent.critic_lr=-1e-4"], "agent.critic_lr=-0.0001 must be a number >= 0"),
        (["agent.critic_penalty=-1"], "agent.critic_penalty=-1.0 must be a number >= 0"),
        (["agent.critic_penalty=inf"], "agent.critic_penalty=inf is not finite"),
        (["eval.actor_average=1"], "eval.actor_average=1.0 must be a number in [0, 1)"),
    ],
)
def test_each_validation_error_is_reported(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as error:
        load(*overrides)
    assert expected in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["foo=1"], "Key 'foo' not in 'RunSchema'"),
        (["estimator.termination=bogus"], "expected one of [zero_precision, absorb]"),
        (["estimator.rollout_dtype=float16"], "expected one of [float32, bfloat16, auto]"),
        (["estimator.mode=ucb"], "expected one of [lcb, map, fixed, quantile]"),
        (["estimator.fixed_weighting=exp"], "expected one of [uniform, lambda]"),
        (["estimator.horizon=2.5"], "could not be converted to Integer"),
        (["seed=abc"], "could not be converted to Integer"),
        (["logger.backend=stdout"], "expected one of [csv, wandb, tensorboard, none]"),
        (["progress=maybe"], "is not a valid bool"),
    ],
)
def test_the_schema_refuses_types_and_choices_while_composing(
    overrides: list[str], expected: str
) -> None:
    with pytest.raises(ConfigCompositionException) as error:
        composed(*overrides)
    assert expected in f"{error.value} {error.value.__cause__}"


def test_unknown_keys_of_a_plain_dict_are_reported() -> None:
    """The Python API passes dicts that no schema checked: load_config finds unknown keys."""
    values = composed()
    values["foo"] = 1
    values["estimator"]["psii"] = 1
    with pytest.raises(ConfigError) as error:
        load_config(values, known_dataset)
    assert "unknown key foo" in str(error.value)
    assert "unknown key estimator.psii" in str(error.value)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as error:
        load("estimator.psi=-1", "train.batch_size=0", "env=nowhere")
    message = str(error.value)
    assert "estimator.psi" in message and "train.batch_size" in message and "nowhere" in message


def test_psi_without_a_paper_value_must_be_given() -> None:
    def custom(env: str):
        return get_family("walker2d"), "my-walker-logs"

    with pytest.raises(ConfigError, match="pass estimator.psi"):
        load_config(composed("env=mine"), custom)
    config, _ = load_config(composed("env=mine", "estimator.psi=1.5"), custom)
    assert config.estimator.psi == 1.5


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[CompletedProcess, Path]]:
    """``scripts/cbop.py`` with the command lines below, in one child process (~1 s each).

    Each runs in its own empty folder (``{folder}`` in its arguments): name -> (run, folder).
    """
    lines = {
        "bad values": [
            "estimator.psi=-1", "dynamics.num_elites=50", "env={folder}/missing.hdf5",
            "hydra.run.dir={folder}",
        ],
        "cfg hydra resolve": ["--cfg", "hydra", "--resolve"],
        "cfg all resolve": ["--cfg", "all", "--resolve"],
        "gym_kwargs without +": ["task.gym_kwargs={use_contact_forces:true}", "--cfg", "job"],
        "gym_kwargs with +": ["+task.gym_kwargs.use_contact_forces=true", "--cfg", "job"],
        "cfg hydra resolve again": ["--cfg", "hydra", "--resolve"],  # after the others ran
    }  # fmt: skip
    folders = {name: tmp_path_factory.mktemp("cli") for name in lines}
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(tmp_path_factory.mktemp("cache"))}
    calls = [
        Call(
            "cbop.py", [a.replace("{folder}", str(folders[name])) for a in args], folders[name], env
        )
        for name, args in lines.items()
    ]
    results = run_programs(calls, timeout_s=120 + 30 * len(calls))
    return {name: (done, folders[name]) for name, done in zip(lines, results, strict=True)}


def test_cli_reports_a_bad_value_without_a_traceback(cli: dict) -> None:
    done, folder = cli["bad values"]
    assert done.returncode == 2
    assert "estimator.psi=-1.0 must be a number >= 0" in done.stderr
    assert "larger than the trained ensemble" in done.stderr
    assert "missing.hdf5" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (folder / "checkpoint.pt").exists()


def test_cfg_hydra_resolve_is_explained_and_its_suggestion_works(cli: dict) -> None:
    refused, folder = cli["cfg hydra resolve"]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "Use --cfg all --resolve" in refused.stderr
    assert list(folder.iterdir()) == []
    again, _ = cli["cfg hydra resolve again"]  # nothing of the runs before it carries over
    assert (again.returncode, again.stdout, again.stderr) == (2, refused.stdout, refused.stderr)
    shown, folder = cli["cfg all resolve"]
    assert shown.returncode == 0 and "dir: runs/demo/cpu/default" in shown.stdout
    assert list(folder.iterdir()) == []


def test_gym_kwargs_are_added_with_a_plus_and_the_error_says_so(cli: dict) -> None:
    """``task.gym_kwargs`` is an open mapping: Hydra refuses new keys without ``+``."""
    refused, _ = cli["gym_kwargs without +"]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "+task.gym_kwargs.use_contact_forces=<value>" in refused.stderr
    shown, _ = cli["gym_kwargs with +"]
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["task"]["gym_kwargs"] == {"use_contact_forces": True}


@pytest.mark.parametrize(
    ("config_name", "overrides", "expected"),
    [
        ("config", ["seed=abc"], "seed=abc: seed must be an integer, e.g. seed=0"),
        ("config", ["seed="], "seed=: seed must be an integer"),
        ("config", ["estimator.psi=abc"], "estimator.psi must be null or a number"),
        ("config", ["estimator.horizon=2.5"], "estimator.horizon must be null or an integer"),
        (
            "config",
            ["estimator.rollout_dtype=float16"],
            "estimator.rollout_dtype must be one of float32, bfloat16, auto",
        ),
        ("config", ["progress=maybe"], "progress must be null or true or false"),
        ("config", ["agent.hidden_sizes=[64,x]"], "item 1 ('x') is not an integer"),
        ("config", ["agent.hidden_sizes=3"], "e.g. agent.hidden_sizes=[256,256,256]"),
        ("config", ["estimator.psii=1"], "(did you mean estimator.psi?); the keys of estimator"),
        ("config", ["fo=1"], "fo=1: fo is not a setting of this script"),
        ("config", ["logger=stdout"], "the choices are csv, none, tensorboard, wandb"),
        ("config", ["preset=fast"], "no preset called 'fast'; the choices are cpu, debug, paper"),
        ("config", ["estimator.psi=[1"], "cannot read a command-line override"),
        ("baseline", ["algo=sac"], "the choices are bc, cql, iql, td3bc"),
        ("baseline", ["algo.alpha=x"], "algo.alpha must be a number, e.g. algo.alpha=2.5"),
        ("evaluate", ["episodes=-"], "episodes must be an integer, e.g. episodes=10"),
        ("collect", ["compression=zip"], "compression must be null or one of gzip, lzf"),
        ("collect", ["sac.hidden_sizes=[x]"], "sac.hidden_sizes must be a list of integers"),
        ("train_dynamics", ["dynamics.lr=fast"], "dynamics.lr must be a number"),
        ("select_psi", ["qvalue_nets=two"], "qvalue_nets must be an integer, e.g. qvalue_nets=2"),
        ("select_psi", ["task.ref_max_score=x"], "task.ref_max_score must be null or a number"),
        ("report", ["analysis=maybe"], "analysis must be true or false"),
        ("report", ["output=x"], "output is not a setting of this script (did you mean out?)"),
    ],
)
def test_hydra_errors_become_one_paragraph_naming_the_key_and_what_it_takes(
    config_name: str, overrides: list[str], expected: str
) -> None:
    """What the user sees for a value the schema refuses (scripts print it after "error: ")."""
    with pytest.raises(Exception) as error:
        composed(*overrides, config_name=config_name)
    message = describe_hydra_error(error.value, config_name)
    assert message is not None and expected in message, message
    assert f"configs/{config_name}.yaml" in message
    assert "\n" not in message and "object_type" not in message and "full_key" not in message


@pytest.mark.parametrize(
    ("config_name", "overrides", "expected"),
    [
        ("config", ["+foo=1"], ["foo"]),
        ("evaluate", ["+task.gym_kwargs.x=1", "+episode=3"], ["episode"]),
        ("collect", ["+sac.lr2=1"], ["sac.lr2"]),
        ("train_dynamics", [], []),
        ("baseline", ["+algo.beta2=1"], ["algo.beta2"]),
        ("select_psi", ["+task.gym_kwargs.x=1", "+step=3"], ["step"]),
        ("report", ["+outdir=x"], ["outdir"]),
    ],
)
def test_keys_added_with_plus_are_found(
    config_name: str, overrides: list[str], expected: list[str]
) -> None:
    """``+key=value`` gets past the schema while composing; the entry point refuses it."""
    register_schemas()
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose(config_name, overrides=overrides)
    assert unknown_keys(cfg, CONFIG_SCHEMAS[config_name]) == expected


def test_an_opt_in_left_off_does_not_change_the_training_settings() -> None:
    """Checkpoints written before ``agent.bc_weight`` existed still resume (same hash)."""
    plain, _ = load()
    assert "bc_weight" not in plain.training_dict()["agent"]
    with_bc, _ = load("agent.bc_weight=2.5")
    assert with_bc.training_dict()["agent"]["bc_weight"] == 2.5
    for key, value in (("critic_penalty", "0.5"), ("critic_layer_norm", "true")):
        assert key not in plain.training_dict()["agent"]
        opted_in, _ = load(f"agent.{key}={value}")
        assert opted_in.training_dict()["agent"][key] in (0.5, True)


def test_a_d4rl_id_alone_composes_its_row_of_the_paper_table() -> None:
    """``cbop-train env=<D4RL id> --cfg job`` shows the values the run uses, not nulls."""
    from cbop_torchrl.apps.api import compose_config, config_name

    assert config_name("cbop", ["env=walker2d-full-replay-v2"]) == (
        "config_paper_walker2d-full-replay-v2"
    )
    assert config_name("cbop", ["env=hopper-medium-v2,walker2d-medium-v2"]) == "config_paper"
    cfg = compose_config(["env=walker2d-full-replay-v2"])
    assert cfg.preset == "paper" and cfg.estimator.psi == 2.0 and cfg.estimator.horizon == 10
    assert cfg.agent.num_qvalue_nets == 20 and cfg.train.epochs == 1000
    assert cfg.dynamics.num_members == 30 and cfg.dynamics.num_elites == 20
    hopper = compose_config(["env=hopper-medium-v2", "estimator.psi=0.7"])
    assert hopper.estimator.psi == 0.7 and hopper.agent.num_qvalue_nets == 50  # overrides win


def test_critic_lr_zero_is_accepted_as_the_frozen_critic_control() -> None:
    config, _ = load("agent.critic_lr=0")
    assert config.agent.critic_lr == 0.0 and config.agent.actor_lr == 3e-4
