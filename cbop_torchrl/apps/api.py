"""The Python API: compose a config like the command line does, run it, get the results.

    from cbop_torchrl import compose_config, train, evaluate

    cfg = compose_config(["preset=debug", "seed=1"])        # = cbop-train preset=debug seed=1
    results = train(cfg, run_dir="runs/api-demo")           # the results.json dict
    scores = evaluate(compose_config(["checkpoint=runs/api-demo/policy.pt"], command="evaluate"))

:func:`compose_config` composes the same Hydra configs with the same typed
schemas (:mod:`cbop_torchrl.cli`'s ``ConfigStore`` entries) as the console
scripts, so an override the command line refuses is refused here too
(``omegaconf``/``hydra`` errors), and the config object is the one the
command-line task functions receive. The functions raise the package's errors
(:class:`~cbop_torchrl.config.ConfigError`, :class:`~cbop_torchrl.data.DatasetError`,
:class:`~cbop_torchrl.trainers.checkpoint.CheckpointError`, ...) where a
program prints them and exits with code 2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbop_torchrl.cli import (
    CONFIG_DIR,
    SCHEMAS,
    config_values,
    paper_dataset_config,
    register_schemas,
    wants_paper_preset,
)

CONFIG_NAMES: dict[str, str] = {
    "cbop": "config",
    "baseline": "baseline",
    "evaluate": "evaluate",
    "collect": "collect",
    "train_dynamics": "train_dynamics",
}
"""Program (:data:`cbop_torchrl.apps.COMMANDS` module) -> its primary config in ``configs/``."""


def config_name(command: str, overrides: Sequence[str]) -> str:
    """The primary config a program composes for these overrides.

    ``cbop`` with a D4RL id in ``env=`` and no ``preset=`` composes
    ``config_paper`` (``config`` with the paper preset), so such a run uses
    the paper's settings (:func:`cbop_torchrl.cli.wants_paper_preset`).
    """
    if command not in CONFIG_NAMES:
        raise ValueError(f"command={command!r} is not one of {', '.join(CONFIG_NAMES)}")
    if command == "cbop" and wants_paper_preset(overrides):
        envs = [arg.partition("=")[2] for arg in overrides if arg.startswith("env=")]
        if len(envs) == 1 and "," not in envs[0]:  # one dataset: its row of the table too
            return paper_dataset_config(envs[0]) or "config_paper"
        return "config_paper"
    return CONFIG_NAMES[command]


def compose_config(overrides: Sequence[str] = (), command: str = "cbop") -> DictConfig:
    """The config ``command``'s program would run with these command-line overrides.

    Args:
        overrides: Hydra overrides as on the command line, e.g. ``["preset=debug",
            "estimator.psi=0.5", "logger=tensorboard"]``.
        command: ``cbop`` (CBOP training, :func:`train`), ``baseline``
            (:func:`train_baseline`), ``evaluate`` (:func:`evaluate`),
            ``collect`` or ``train_dynamics``.

    Returns:
        The composed config (without Hydra's own ``hydra`` section), typed by
        the program's schema: assigning a wrong type to a key raises.
    """
    from hydra import compose, initialize_config_dir

    register_schemas()
    name = config_name(command, overrides)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def _as_config(cfg: DictConfig | Mapping[str, Any], schema: str) -> DictConfig:
    """``cfg`` itself, or a mapping checked against the program's schema."""
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.merge(OmegaConf.structured(SCHEMAS[schema]), dict(cfg))


def _load(values: dict[str, Any]) -> tuple[Any, Any, Any, list[str]]:
    """``(RunConfig, DatasetInfo, dataset, filled paper fields)`` of a run's config values."""
    from cbop_torchrl.config import load_config
    from cbop_torchrl.data import load_dataset_with_info

    loaded: dict[str, Any] = {}

    def lookup_dataset(env: str) -> tuple[str | None, str]:
        loaded["data"], loaded["info"] = load_dataset_with_info(env)
        return loaded["info"].family, loaded["info"].name

    config, filled = load_config(values, lookup_dataset)
    return config, loaded["info"], loaded["data"], filled


def _check_memory(config: Any, info: Any, rollouts: bool) -> None:
    """Refuses (:class:`~cbop_torchrl.config.ConfigError`) sizes that cannot fit in memory,
    before any stage allocates them (:mod:`cbop_torchrl.trainers.memory`)."""
    from cbop_torchrl.config import ConfigError
    from cbop_torchrl.runtime import resolve_device
    from cbop_torchrl.trainers.memory import MemoryLimitError, check_run_fits

    try:
        check_run_fits(config, info.obs_dim, info.action_dim, resolve_device(config.device),
                       rollouts, int(info.num_transitions))  # fmt: skip
    except MemoryLimitError as error:
        raise ConfigError(str(error)) from None


def train(cfg: DictConfig | Mapping[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """Trains CBOP as ``cbop-train`` does (dynamics -> BC -> FQE -> CBOP -> evaluation).

    Args:
        cfg: a config from :func:`compose_config` (``command="cbop"``).
        run_dir: where the checkpoint, the policy, the logs and ``results.json``
            go; a run there with a checkpoint is continued (``resume=auto``).

    Returns:
        The ``results.json`` dict (normalized score, return, gradient steps, E[h], ...).
    """
    from cbop_torchrl.trainers.offline import run_pipeline

    values = config_values(_as_config(cfg, "run"))
    config, info, data, filled = _load(values)  # a runs section: refused (train_side_by_side)
    _check_memory(config, info, rollouts=True)
    if config.progress:
        banner = run_banner(config, info.name, Path(run_dir), filled)
        if (task := task_line(config, info)) is not None:
            first, _, rest = banner.partition("\n")
            banner = f"{first}\n[cbop]   {task}\n{rest}"
        print(banner, flush=True)
    return run_pipeline(config, info, data, Path(run_dir))


def runs_given(cfg: DictConfig | Mapping[str, Any]) -> bool:
    """Whether ``cfg`` lists several runs (``runs.seeds``, ``runs.psi`` or ``runs.set``)."""
    from cbop_torchrl.config.runs import RunsConfig

    runs = cfg.get("runs") if isinstance(cfg, (DictConfig, Mapping)) else None
    if isinstance(runs, DictConfig):
        runs = OmegaConf.to_container(runs, resolve=True)
    return RunsConfig.from_values(runs).given


def _run_config(cfg: DictConfig, overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """The config values of one run side by side: ``cfg`` with its overrides, without runs."""
    from omegaconf.errors import OmegaConfBaseException

    from cbop_torchrl.config import ConfigError

    run_cfg = cfg.copy()
    for key, value in overrides:
        try:
            if OmegaConf.select(run_cfg, key, default=_ABSENT) is _ABSENT:
                raise KeyError(key)
            OmegaConf.update(run_cfg, key, value, merge=False)
        except (KeyError, OmegaConfBaseException) as error:
            detail = "no such key" if isinstance(error, KeyError) else str(error).splitlines()[0]
            raise ConfigError(
                f"runs: {key}={value!r} cannot be set ({detail}); each override of runs.set "
                "names an existing key with a value of its type, as on the command line "
                '(e.g. runs.set=["agent.actor_lr=1e-4"])'
            ) from None
    values = config_values(run_cfg)
    values.pop("runs", None)
    return values


_ABSENT = object()


def train_side_by_side(
    cfg: DictConfig | Mapping[str, Any], job_dir: str | Path
) -> dict[str, dict[str, Any]]:
    """Trains the runs of ``cfg``'s ``runs`` section side by side, as ``cbop-train`` does.

    Each run is the run its overrides give alone (``seed=S estimator.psi=P ...``), in its
    own directory ``job_dir/<name>`` (``psi<P>-seed<S>``, :func:`~cbop_torchrl.config.runs.
    expand_runs`), with its own checkpoint, resume and ``results.json``; the runs take
    turns per gradient step in one process (:mod:`cbop_torchrl.trainers.side_by_side`).
    Every run's config is checked before any work. With ``runs.pretrain_together`` (the
    default) the missing pretraining stages of every distinct seed train together first
    and are cached where each run looks for them
    (:mod:`cbop_torchrl.trainers.pretrain_together`).

    Args:
        cfg: a config from :func:`compose_config` with a ``runs`` section (``runs.seeds``,
            ``runs.psi``, ``runs.set``).
        job_dir: the folder of the runs' directories.

    Returns:
        Each run's name (its directory's) -> its ``results.json`` dict, in the runs' order.

    Raises:
        ConfigError: an empty list, runs that would differ in a tensor's shape or a
            setting of the process, two runs with the same directory, any run's invalid
            config.
    """
    from cbop_torchrl.config import ConfigError, load_config
    from cbop_torchrl.config.runs import RunsConfig, expand_runs
    from cbop_torchrl.runtime import resolve_device
    from cbop_torchrl.trainers.offline import run_pipeline
    from cbop_torchrl.trainers.rundir import claim_run_dir
    from cbop_torchrl.trainers.side_by_side import train_in_turn

    cfg = _as_config(cfg, "run")
    runs = RunsConfig.from_values(OmegaConf.to_container(cfg.runs, resolve=True))
    if not runs.given:
        raise ConfigError(
            "train_side_by_side needs a runs section (e.g. runs.seeds=[0,1,2]); "
            "train() trains a single run"
        )
    specs = expand_runs(runs)
    all_values = [_run_config(cfg, spec.overrides) for spec in specs]
    first, info, data, filled = _load(all_values[0])  # the dataset, loaded once
    configs = [first] + [
        load_config(values, lambda env: (info.family, info.name))[0] for values in all_values[1:]
    ]
    for config in configs:
        _check_memory(config, info, rollouts=True)
    job_dir = Path(job_dir)
    names = [spec.name for spec in specs]
    claim_run_dir(job_dir)  # marked as a run's folder: the same command continues in it
    if first.progress:
        print(run_banner(first, info.name, job_dir / names[0], filled), flush=True)
        print(f"[cbop] {len(names)} runs side by side in {_shown_path(job_dir)}: "
              f"{', '.join(names)}", flush=True)  # fmt: skip

    device = resolve_device(first.device)  # decided once for the job: its runs share it
    if runs.pretrain_together:  # the seeds' missing dynamics, BC and FQE, trained together
        from cbop_torchrl.trainers.decisions import uses_cuda_graph
        from cbop_torchrl.trainers.pretrain_together import pretrain_together

        pretrain_together(
            configs, info, data, [job_dir / name for name in names],
            device=device, cuda_graph=uses_cuda_graph(first, device),
        )  # fmt: skip

    def trainer(config: Any, run_dir: Path) -> Any:
        return lambda take_turns: run_pipeline(config, info, data, run_dir, take_turns)

    results = train_in_turn(
        [trainer(config, job_dir / name) for config, name in zip(configs, names, strict=True)],
        names,
        device,
    )
    return dict(zip(names, results, strict=True))


def task_line(config: Any, info: Any) -> str | None:
    """``task: <gym id> ...`` for the banner: the environment, its gymnasium keyword
    arguments and, where the data chose an observation layout, that it did; None when the
    task cannot be resolved (the pipeline then reports why)."""
    from cbop_torchrl.envs.task import resolve_task
    from cbop_torchrl.registry import layout_for

    try:
        task = resolve_task(config.task, info)
    except Exception:  # reported with its full message when the pipeline resolves it
        return None
    text = f"task: {task.gym_id}"
    if task.gym_kwargs:
        text += " with " + ", ".join(f"{k}={v}" for k, v in task.gym_kwargs.items())
    chosen = layout_for(task.name, info.obs_dim)
    if chosen is not None and all(task.gym_kwargs.get(k) == v for k, v in chosen.items()):
        text += (
            f" (the layout of the data's {info.obs_dim}-wide observations; "
            "+task.gym_kwargs.<name>=<value> chooses another)"
        )
    if task.has_reference_scores:
        text += f", normalized by returns {task.ref_min_score} (0) and {task.ref_max_score} (100)"
    return text


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _where(config: Any, dataset: str, run_dir: Path) -> str:
    import torch

    from cbop_torchrl.runtime import resolve_device

    threads = config.threads if config.threads is not None else torch.get_num_threads()
    return (
        f"{dataset}, preset {config.preset}, seed {config.seed}, on "
        f"{resolve_device(config.device)} with {threads} thread{'s' * (threads != 1)}; run "
        f"directory {_shown_path(run_dir)}"
    )


def _same_budget_override(total: int, steps_per_epoch: int) -> str:
    """The baseline overrides that train ``total`` gradient steps."""
    if total % steps_per_epoch == 0:
        return f"train.epochs={total // steps_per_epoch}"
    return f"train.epochs=1 train.steps_per_epoch={total}"


def _baseline_command(config: Any, total: int) -> str:
    """A ``cbop-baseline`` command on the same data and preset with ``total`` gradient steps.

    Without overrides a baseline trains as many steps as the preset's own pipeline
    (:func:`cbop_torchrl.baselines.pipeline_epochs`); other settings need ``train.epochs``.
    """
    import shlex

    from cbop_torchrl.baselines import cbop_pipeline_budget, preset_training
    from cbop_torchrl.runtime import override_word, program_command

    words = ["algo=iql"]
    if config.env != "demo":
        words.append(override_word("env", config.env))
    if config.preset != "cpu":
        words.append(override_word("preset", config.preset))
    words += task_overrides(config.task)
    preset = preset_training(config.preset)
    default = cbop_pipeline_budget(
        config.preset, preset["bc.steps"], preset["fqe.steps"], preset["train.steps_per_epoch"]
    ).total
    if default != total:
        words += _same_budget_override(total, preset["train.steps_per_epoch"]).split()
    return f"{program_command('cbop-baseline')} {shlex.join(words)}"


def task_overrides(task: Any) -> list[str]:
    """The ``task.*`` overrides that set ``task`` (a :class:`~cbop_torchrl.envs.task.TaskConfig`
    or its dict) on another program's command line: every key that is not its default."""
    import dataclasses

    from cbop_torchrl.envs.task import TaskConfig
    from cbop_torchrl.runtime import override_word

    values = dataclasses.asdict(task) if dataclasses.is_dataclass(task) else dict(task or {})
    default = dataclasses.asdict(TaskConfig())
    words = []
    for key, value in values.items():
        if key == "gym_kwargs":
            words += [override_word(f"+task.gym_kwargs.{name}", item)
                      for name, item in (value or {}).items()]  # fmt: skip
        elif value != default.get(key):
            words.append(override_word(f"task.{key}", value))
    return words


def pipeline_steps(config: Any) -> int:
    """CBOP's gradient steps over its whole pipeline: BC + FQE + the CBOP stage."""
    return int(config.bc.steps) + int(config.fqe.steps) + config.train.total_steps


def run_banner(config: Any, dataset: str, run_dir: Path, filled: Sequence[str] = ()) -> str:
    """The lines ``cbop-train`` prints first: where the run goes and each stage's settings.

    ``filled``: the dotted keys taken from the paper's table (their values are listed).
    """
    dynamics, agent, estimator = config.dynamics, config.agent, config.estimator
    train = config.train
    rollout = str(estimator.rollout_dtype)
    if rollout == "auto":
        rollout = "auto (bfloat16 where faster and accurate enough, measured before the stage)"
    evaluation = f"{config.eval.episodes} episodes of up to {config.eval.max_steps} steps"
    if config.eval.interval:
        evaluation += f", every {config.eval.interval} gradient steps and at the end"
    else:
        evaluation += ", at the end"
    total = pipeline_steps(config)
    lines = [
        f"[cbop] {_where(config, dataset, run_dir)}",
        f"[cbop]   dynamics: {dynamics.num_members} members, K={dynamics.num_elites} elites, "
        f"{dynamics.num_layers}x{dynamics.hidden_size} {dynamics.activation}, up to "
        f"{dynamics.max_epochs or 'as many as improve'} epoch{'s' * (dynamics.max_epochs != 1)}, "
        f"batch {dynamics.batch_size}",
        f"[cbop]   bc: {config.bc.steps} steps, batch {config.bc.batch_size}",
        f"[cbop]   fqe: {config.fqe.steps} steps, batch {config.fqe.batch_size}, "
        f"M={agent.num_qvalue_nets}",
        f"[cbop]   cbop: {train.total_steps} gradient steps ({train.epochs} x "
        f"{train.steps_per_epoch}), batch {train.batch_size}, psi={estimator.psi}, "
        f"M={agent.num_qvalue_nets}, K={dynamics.num_elites}, H={estimator.horizon}, "
        f"{estimator.mode} targets, rollout dtype {rollout}",
        f"[cbop]   eval: {evaluation}",
        f"[cbop] {total} gradient steps in all (BC {config.bc.steps} + FQE {config.fqe.steps} "
        f"+ CBOP {train.total_steps}); a baseline with the same budget (algo=bc|td3bc|iql|cql): "
        f"{_baseline_command(config, total)}",
    ]
    if filled:
        from cbop_torchrl.config import generated_psi

        chosen = "estimator.psi" in filled and generated_psi(dataset) is not None
        table = [key for key in filled if not (chosen and key == "estimator.psi")]
        if table:
            values = ", ".join(f"{key}={_value_of(config, key)}" for key in table)
            lines.append(f"[cbop] from the paper's table for {dataset}: {values}")
        if chosen:  # GENERATED_PSI: this project's choice, made the paper's way
            lines.append(
                f"[cbop] estimator.psi={estimator.psi}: this project's offline choice for "
                f"{dataset} (fitted Q evaluation over the paper's grid 0.5, 2, 3, 5)"
            )
    return "\n".join(lines)


def _value_of(config: Any, dotted: str) -> Any:
    section, _, name = dotted.partition(".")
    return getattr(getattr(config, section), name)


def baseline_banner(config: Any, algo: str, dataset: str, run_dir: Path) -> str:
    """The lines ``cbop-baseline`` prints first, with its budget beside CBOP's."""
    from cbop_torchrl.baselines import cbop_pipeline_budget

    train = config.train
    pipeline = cbop_pipeline_budget(
        config.preset, config.bc.steps, config.fqe.steps, train.steps_per_epoch
    )
    default_epochs = -(-pipeline.total // train.steps_per_epoch)  # pipeline_epochs, the default
    budget = f"cbop-train's whole pipeline with these settings trains {pipeline.describe()}"
    if train.epochs == default_epochs:
        budget = f"the default, {budget}" + (
            "" if train.total_steps == pipeline.total else ", rounded up to whole epochs"
        )
    else:
        budget += f"; train.epochs={default_epochs} (the default) trains as many"
    return "\n".join(
        [
            f"[baseline] {algo}: {_where(config, dataset, run_dir)}",
            f"[baseline]   train: {train.total_steps} gradient steps (train.epochs="
            f"{train.epochs} x train.steps_per_epoch={train.steps_per_epoch}), batch "
            f"{train.batch_size}, hidden {'x'.join(map(str, config.agent.hidden_sizes))}",
            f"[baseline]   budget: {budget}",
        ]
    )


def train_baseline(cfg: DictConfig | Mapping[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """Trains a model-free baseline as ``cbop-baseline`` does; returns its ``results.json`` dict.

    Args:
        cfg: a config from :func:`compose_config` (``command="baseline"``, e.g.
            overrides ``["algo=iql", "preset=debug"]``).
        run_dir: the run directory, as for :func:`train`.
    """
    from cbop_torchrl.baselines import AlgoConfig, run_baseline

    values = config_values(_as_config(cfg, "baseline"))
    algo = AlgoConfig.from_dict(values.pop("algo"))
    # psi is CBOP's; a null would ask the paper table for it, which knows D4RL names only.
    if values.get("estimator", {}).get("psi") is None:
        values.setdefault("estimator", {})["psi"] = 0.0
    config, info, data, _ = _load(values)
    _check_memory(config, info, rollouts=False)
    if config.progress:
        print(baseline_banner(config, algo.name, info.name, Path(run_dir)), flush=True)
    return run_baseline(config, algo, info, data, Path(run_dir))


def evaluate(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Scores a saved policy as ``cbop-evaluate`` does; returns the summary it prints/writes.

    Args:
        cfg: a config from :func:`compose_config` (``command="evaluate"``), e.g.
            overrides ``["checkpoint=runs/.../policy.pt", "episodes=20"]``;
            ``output=<path>`` also writes the summary there as JSON.

    Returns:
        ``checkpoint``, the policy's metadata (``dataset``, ``step``, sizes),
        ``task`` and the evaluation's ``returns``, normalized score, ...
    """
    from cbop_torchrl.config import ConfigError
    from cbop_torchrl.envs import (
        EVALUATION_FORMAT,
        check_sizes_fit_env,
        evaluate_policy,
        evaluation_output_problem,
        make_eval_env,
        read_env_specs,
    )
    from cbop_torchrl.envs.task import override_task
    from cbop_torchrl.io import atomic_json_dump
    from cbop_torchrl.runtime import resolve_device
    from cbop_torchrl.trainers.checkpoint import load_policy
    from cbop_torchrl.trainers.memory import MemoryLimitError, check_evaluation_fits

    cfg = _as_config(cfg, "evaluate")
    if cfg.episodes < 1 or cfg.max_steps < 1:
        raise ConfigError(
            f"episodes={cfg.episodes} and max_steps={cfg.max_steps} must be positive integers "
            "(e.g. episodes=10 max_steps=1000)"
        )
    if cfg.output and (problem := evaluation_output_problem(cfg.output, cfg.checkpoint)):
        raise ConfigError(problem)
    command_line_gym_id = cfg.task.get("gym_id")
    actor, recorded, meta = load_policy(cfg.checkpoint, resolve_device(cfg.device),
                                        command_line_gym_id)  # fmt: skip
    try:
        check_evaluation_fits(cfg.episodes, cfg.max_steps, meta["obs_dim"], meta["action_dim"])
    except MemoryLimitError as error:
        raise ConfigError(str(error)) from None
    task = override_task(recorded, OmegaConf.to_container(cfg.task, resolve=True))
    specs = read_env_specs(task)
    check_sizes_fit_env(f"the policy {str(cfg.checkpoint)!r}", meta["obs_dim"],
                        meta["action_dim"], specs, task)  # fmt: skip
    env = make_eval_env(task, cfg.episodes, cfg.backend)
    try:
        result = evaluate_policy(actor, task, env, cfg.max_steps, cfg.seed)
    except Exception as error:
        if isinstance(error, MemoryError) or "memory" in str(error).lower():
            raise ConfigError(
                f"the evaluation ran out of memory with episodes={cfg.episodes} environments "
                f"side by side ({type(error).__name__}: {error}); pass fewer episodes, and run "
                "the command again with another seed= for more"
            ) from None
        raise
    finally:
        env.close(raise_if_closed=False)  # a failed start closed it; its error is the one to see
    summary = {"format": EVALUATION_FORMAT, "checkpoint": str(cfg.checkpoint), **meta,
               "task": task.to_dict(), **result.summary()}  # fmt: skip
    if cfg.output:
        if problem := evaluation_output_problem(cfg.output, cfg.checkpoint):
            raise ConfigError(problem)  # something else took its place meanwhile
        atomic_json_dump(summary, cfg.output)
    return summary
