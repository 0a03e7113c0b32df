"""Offline policy selection by fitted Q evaluation (paper appendix C, Paine et al. 2020).

For each trained policy ``pi`` a fresh Q-ensemble ``Q_zeta`` is fitted to
``pi``'s value on the offline data (FQE), and the policy is scored by

    V_fqe(pi) = E_{s0 in D}[ mean_m Q_zeta_m(s0, pi(s0)) ]

over the dataset's initial states (the first row of every episode).
Candidates (e.g. psi values) are ranked by this score averaged over their
seeds, without touching the environment; when the runs were also evaluated
online (``results.json``), Spearman's rho compares the two rankings.

The regression is :class:`FittedQEvaluationLoss`, the same one that
pretrains CBOP's critic, run by the same loop
(:func:`cbop_torchrl.trainers.pretrain.run_supervised_stage`). The only
change is the next action: pretraining evaluates the behaviour policy and
reads the dataset's next action; here the policy is fixed and
deterministic (the one evaluated online), so ``pi(s')`` is computed once
for every row and stored as ``("next", "action")``. Every row is then
usable, timeouts included (``("next", "observation")`` is always the real
next state, so ``r + gamma * Q(s', pi(s'))`` is a valid target there).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.objectives import SoftUpdate

from cbop_torchrl.config import PretrainConfig
from cbop_torchrl.data import load_dataset_with_info, make_replay_buffer
from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.io import config_hash, make_dirs
from cbop_torchrl.modules.actor_critic import make_qvalue_ensemble
from cbop_torchrl.objectives.pretrain import ROW_KEY, FittedQEvaluationLoss, bootstrap_counts
from cbop_torchrl.runtime import seed_everything
from cbop_torchrl.sweeps import SweepError, policy_file, read_run
from cbop_torchrl.trainers.checkpoint import load_policy, save_stage
from cbop_torchrl.trainers.pretrain import read_cached_stage, run_supervised_stage

FQE_KEYS = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
)

ACTION_CHUNK = 65_536
"""Rows per actor call when computing ``pi(s')`` for the whole dataset (bounds memory)."""


@dataclass
class SelectionFQEConfig:
    """The FQE fit of one policy.

    ``steps``/``batch_size``/``lr``/``checkpoint_interval`` have the meaning
    of :class:`cbop_torchrl.config.PretrainConfig`; ``tau`` is the target
    ensemble's Polyak rate, so ``steps * tau`` is about the number of
    value-iteration sweeps the fit makes (:func:`fqe_config_for_run` takes
    them from the run's own FQE stage; ``hidden_sizes`` and ``gamma`` from
    its critic).
    """

    steps: int = 10_000
    batch_size: int = 256
    lr: float = 3e-4
    checkpoint_interval: int = 2_000
    num_qvalue_nets: int = 2
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    gamma: float = 0.99
    tau: float = 0.005

    def pretrain_config(self) -> PretrainConfig:
        return PretrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            checkpoint_interval=self.checkpoint_interval,
        )


def episode_starts(data: TensorDictBase) -> torch.Tensor:
    """Which rows open an episode: row 0 and every row after a ``done`` row.

    ``("next", "done")`` covers terminals, timeouts and the last row of a cut
    episode (the dataset layer marks those truncated), so this finds every
    episode's first row.

    Returns:
        ``[N]`` bool.
    """
    done = data.get(("next", "done")).reshape(-1)
    starts = torch.ones_like(done)
    starts[1:] = done[:-1]
    return starts


@torch.no_grad()
def deterministic_actions(actor: TensorDictModuleBase, observation: torch.Tensor) -> torch.Tensor:
    """``pi(s)`` of the deterministic policy (the tanh of the Gaussian mean).

    Args:
        actor: reads ``observation``, writes ``action``.
        observation: ``[N, obs]``.

    Returns:
        ``[N, act]``.
    """
    chunks = []
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for part in observation.split(ACTION_CHUNK):
            inputs = TensorDict({"observation": part}, batch_size=part.shape[:1])
            chunks.append(actor(inputs).get("action"))
    return torch.cat(chunks)


def policy_fqe_data(data: TensorDictBase, actor: TensorDictModuleBase) -> TensorDictBase:
    """The FQE training rows for ``actor``: every transition, ``("next", "action") = pi(s')``.

    Returns a TensorDict of batch ``[N]`` with :data:`FQE_KEYS`,
    ``("next", "action")`` ``[N, act]`` and ``row`` (the row index, for the
    bootstrap weights).
    """
    rows = data.select(*FQE_KEYS)
    rows.set(("next", "action"), deterministic_actions(actor, rows.get(("next", "observation"))))
    rows.set(ROW_KEY, torch.arange(rows.shape[0], device=rows.device))
    return rows


def make_fqe_loss(
    obs_dim: int,
    action_dim: int,
    config: SelectionFQEConfig,
    num_rows: int | None,
    device: torch.device,
) -> FittedQEvaluationLoss:
    """A fresh Q-ensemble in a :class:`FittedQEvaluationLoss`.

    With M > 1 members and ``num_rows`` given, each member trains on its own
    bootstrap resample of the ``num_rows`` rows (as in pretraining).
    """
    qnets = make_qvalue_ensemble(
        config.num_qvalue_nets, obs_dim, action_dim, tuple(config.hidden_sizes), device=device
    )
    counts = None
    if config.num_qvalue_nets > 1 and num_rows is not None:
        counts = bootstrap_counts(config.num_qvalue_nets, num_rows).to(device)
    return FittedQEvaluationLoss(qnets, gamma=config.gamma, bootstrap_weights=counts)


def fit_policy_fqe(
    data: TensorDictBase,
    actor: TensorDictModuleBase,
    obs_dim: int,
    action_dim: int,
    config: SelectionFQEConfig,
    seed: int,
    work_dir: Path,
    progress: bool = False,
    log_fn: Callable[[dict[str, float], int], None] | None = None,
    on_step: Callable[[int, FittedQEvaluationLoss], None] | None = None,
) -> FittedQEvaluationLoss:
    """Fits ``Q_zeta`` to the value of ``actor`` on ``data``; resumable and cached.

    ``work_dir/result.pt`` holds a finished fit (returned as is on the next
    call); ``work_dir/partial.pt`` the last checkpoint of an unfinished one.
    The caller picks ``work_dir`` so that it changes with the policy, the
    data and ``config`` (see :func:`evaluate_policy_offline`).

    Args:
        data: the dataset TensorDict ``[N]`` (on the device to train on).
        actor: the policy to evaluate (same device as ``data``).
        obs_dim, action_dim: sizes of the Q-networks' inputs.
        config: FQE settings.
        seed: seeds the networks, the bootstrap resamples and the batch order.
        work_dir: checkpoint/result directory.
        on_step: called with (step, loss) after each step's target update, to watch the
            fit (``benchmarks/fqe_trajectory.py``); not called when a finished fit is read.
    """
    work_dir = make_dirs(work_dir)  # never through a link
    result = work_dir / "result.pt"
    # a cached fit carries its SHA-256 and entry (trainers/checkpoint.py: read_stage)
    if (state := read_cached_stage(result, "fit")) is not None:
        loss = make_fqe_loss(obs_dim, action_dim, config, None, data.device)
        loss.load_state_dict({k: v.to(data.device) for k, v in state.items()})
        return loss
    seed_everything(seed)
    rows = policy_fqe_data(data, actor)
    loss = make_fqe_loss(obs_dim, action_dim, config, rows.shape[0], data.device)
    buffer = make_replay_buffer(rows, config.batch_size, device=data.device)
    generator = torch.Generator(device=data.device).manual_seed(seed)
    buffer.set_rng(generator)
    updater = SoftUpdate(loss, tau=config.tau)

    def after_step(step: int) -> None:
        updater.step()
        if on_step is not None:
            on_step(step, loss)

    run_supervised_stage(
        "fqe_select",
        loss,
        buffer,
        generator,
        config.pretrain_config(),
        work_dir,
        progress,
        log_fn,
        after_step,
        log_interval=max(1, config.steps // 10),
    )
    fit = {k: v.detach().cpu() for k, v in loss.state_dict().items()}
    save_stage({"fit": fit}, result, None)
    (work_dir / "partial.pt").unlink(missing_ok=True)
    return loss


@torch.no_grad()
def initial_state_value(
    loss: FittedQEvaluationLoss, actor: TensorDictModuleBase, initial_observation: torch.Tensor
) -> float:
    """``E_{s0}[mean_m Q_m(s0, pi(s0))]`` over ``initial_observation`` ``[E, obs]``."""
    inputs = TensorDict(
        {
            "observation": initial_observation,
            "action": deterministic_actions(actor, initial_observation),
        },
        batch_size=initial_observation.shape[:1],
    )
    q = loss.ensemble_q(inputs, loss.qvalue_network_params)  # [M, E, 1]
    return float(q.mean())


def evaluate_policy_offline(
    data: TensorDictBase,
    actor: TensorDictModuleBase,
    obs_dim: int,
    action_dim: int,
    config: SelectionFQEConfig,
    seed: int,
    cache_root: Path,
    cache_key: Mapping[str, Any],
    progress: bool = False,
) -> float:
    """The FQE score ``V_fqe(pi)`` of ``actor`` on ``data`` (fit cached under ``cache_root``).

    ``cache_key`` names what was evaluated (dataset fingerprint, policy step,
    ...); together with ``config`` and ``seed`` it picks the fit's directory.
    """
    key = {**dict(cache_key), "config": asdict(config), "seed": seed}
    work_dir = Path(cache_root) / config_hash(key)
    loss = fit_policy_fqe(data, actor, obs_dim, action_dim, config, seed, work_dir, progress)
    value = initial_state_value(loss, actor, data.get("observation")[episode_starts(data)])
    if not math.isfinite(value):
        raise FloatingPointError(f"the FQE score is not finite ({value}); fit in {work_dir}")
    return value


def average_ranks(values: list[float], descending: bool = True) -> list[float]:
    """1-based ranks of ``values`` (1 = largest when ``descending``); ties share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: -values[i] if descending else values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman_rho(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation of two score lists (Pearson's r of their average ranks).

    Returns None when it is undefined: fewer than two items, or all values of
    one list tied.
    """
    if len(a) != len(b):
        raise ValueError(f"spearman_rho needs lists of equal length; got {len(a)} and {len(b)}")
    if len(a) < 2:
        return None
    ra, rb = average_ranks(a), average_ranks(b)
    mean_a, mean_b = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(ra, rb, strict=True))
    var_a = sum((x - mean_a) ** 2 for x in ra)
    var_b = sum((y - mean_b) ** 2 for y in rb)
    if var_a == 0 or var_b == 0:
        return None
    return cov / math.sqrt(var_a * var_b)


IGNORED_SETTINGS = ("seed", "dynamics.seed", "device", "threads", "resume", "progress", "preset")
IGNORED_PREFIXES = ("eval.", "logger.", "env")
IGNORED_SUFFIXES = ("checkpoint_interval", "log_interval")
"""Run settings that do not make a different candidate (seeds, where and how a run reports)."""


def flatten_settings(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config.json`` as dotted keys (``{"estimator.psi": 2.0, ...}``), minus ignored keys."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_settings(value, f"{dotted}."))
        elif not (
            dotted in IGNORED_SETTINGS
            or dotted.startswith(IGNORED_PREFIXES)
            or dotted.endswith(IGNORED_SUFFIXES)
        ):
            flat[dotted] = tuple(value) if isinstance(value, list) else value
    return flat


@dataclass
class RunScore:
    """One trained policy: its settings, its FQE score and its online score (if evaluated)."""

    run_dir: Path
    env: str  # the dataset source the run trained on (config.json ``env``)
    dataset: str  # its clean name
    seed: int
    settings: dict[str, Any]  # flatten_settings(config.json)
    fqe_value: float
    online_score: float | None  # see online_score(); None: not evaluated
    policy_step: int
    fqe_settings: dict[str, Any] = field(default_factory=dict)  # asdict(SelectionFQEConfig)


@dataclass
class Candidate:
    """The runs of one setting (all seeds), scored by their mean."""

    label: str  # the settings that differ between the dataset's candidates
    runs: list[RunScore]

    @property
    def fqe_value(self) -> float:
        return sum(run.fqe_value for run in self.runs) / len(self.runs)

    @property
    def online_score(self) -> float | None:
        scores = [run.online_score for run in self.runs]
        if any(score is None for score in scores):
            return None
        return sum(scores) / len(scores)


@dataclass
class DatasetRanking:
    """The candidates of one dataset, best FQE score first, with both rankings."""

    env: str
    dataset: str
    candidates: list[Candidate]
    fqe_ranks: list[float]
    online_ranks: list[float] | None  # None unless every candidate has online scores
    rho: float | None  # Spearman's rho between the rankings; None when undefined

    @property
    def selected(self) -> Candidate:
        return self.candidates[0]


def rank_runs(runs: list[RunScore]) -> list[DatasetRanking]:
    """Groups runs by dataset and by setting, ranks the settings by FQE and online score.

    Within a dataset, runs whose settings (:func:`flatten_settings`) are equal
    form one candidate (their seeds); a candidate's label lists the settings
    that differ between the dataset's candidates (``estimator.psi=2.0``).
    """
    rankings = []
    for env in sorted({run.env for run in runs}):
        group = [run for run in runs if run.env == env]
        keys = sorted({key for run in group for key in run.settings})
        varying = [k for k in keys if len({_same(run.settings.get(k)) for run in group}) > 1]
        by_setting: dict[tuple, list[RunScore]] = {}
        for run in group:
            setting = tuple(_same(run.settings.get(k)) for k in varying)
            by_setting.setdefault(setting, []).append(run)
        candidates = []
        for members in by_setting.values():
            first = members[0].settings
            label = ",".join(f"{k}={_show(first.get(k))}" for k in varying) or "(single)"
            candidates.append(Candidate(label, sorted(members, key=lambda run: run.seed)))
        candidates.sort(key=lambda c: (-c.fqe_value, c.label))
        fqe = [c.fqe_value for c in candidates]
        online = [c.online_score for c in candidates]
        has_online = all(score is not None for score in online)
        rankings.append(
            DatasetRanking(
                env=env,
                dataset=group[0].dataset,
                candidates=candidates,
                fqe_ranks=average_ranks(fqe),
                online_ranks=average_ranks(online) if has_online else None,
                rho=spearman_rho(fqe, online) if has_online else None,
            )
        )
    return rankings


def _same(value: Any) -> str:
    """A comparison key under which 5 and 5.0 (``psi=5`` vs ``psi=5.0``) are one setting."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return repr(value)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def fqe_config_for_run(config: Mapping[str, Any], **overrides: Any) -> SelectionFQEConfig:
    """FQE settings for a run: its own FQE stage and critic sizes, then ``overrides`` (not None).

    The target rate is the FQE stage's ``fqe.target_tau``, not the critic's ``agent.tau``:
    the stage's steps were sized with its own rate (the CPU preset: 5,000 steps at 0.1, about
    500 sweeps), and at the critic's 0.005 the same steps make about 25 sweeps, too few for
    the value to reach the start states' returns at gamma 0.99. Runs from before
    ``fqe.target_tau`` existed fall back to ``agent.tau``.
    """
    fqe, agent = config.get("fqe", {}), config.get("agent", {})
    values = {
        "steps": fqe.get("steps"),
        "batch_size": fqe.get("batch_size"),
        "lr": fqe.get("lr"),
        "checkpoint_interval": fqe.get("checkpoint_interval"),
        "hidden_sizes": agent.get("hidden_sizes"),
        "gamma": agent.get("gamma"),
        "tau": fqe.get("target_tau", agent.get("tau")),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return SelectionFQEConfig(**{k: v for k, v in values.items() if v is not None})


def _weights_digest(actor: TensorDictModuleBase) -> str:
    digest = hashlib.sha1()
    for name, value in sorted(actor.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def online_score(
    results: dict[str, Any] | None, task: TaskConfig | Mapping[str, Any] | None = None
) -> float | None:
    """A run's online score from its ``results.json`` (None: not evaluated).

    The D4RL-normalized score when ``task.ref_min_score``/``ref_max_score`` are
    given or the run's task had them, else the raw return: a task without
    reference scores still ranks (the ranking and Spearman's rho only use order).
    """
    if results is None:
        return None
    task = task if isinstance(task, TaskConfig) else TaskConfig.from_dict(task)
    if task.ref_min_score is not None and task.ref_max_score is not None:
        span = float(task.ref_max_score) - float(task.ref_min_score)
        return 100.0 * (float(results["return_mean"]) - float(task.ref_min_score)) / span
    if results.get("normalized_score_mean") is not None:
        return results["normalized_score_mean"]
    return results.get("return_mean")


def score_runs(
    run_dirs: list[Path],
    device: torch.device | str = "cpu",
    progress: bool = False,
    on_run: Callable[[int, Path], None] | None = None,
    task: TaskConfig | Mapping[str, Any] | None = None,
    fit_dir: Callable[[Path], Path] | None = None,
    **fqe_overrides: Any,
) -> list[RunScore]:
    """FQE score (and online score, when evaluated) of every run in ``run_dirs``.

    Each run's policy is evaluated on the dataset it was trained on
    (``config.json`` ``env``; loaded once per dataset). Fits are cached in
    ``<run_dir>/selection_fqe/<hash>/``, keyed by the policy's weights, the
    dataset and the FQE settings, so a second call is fast and an
    interrupted fit resumes.

    Args:
        run_dirs: from :func:`cbop_torchrl.sweeps.find_runs`.
        device: where FQE trains.
        progress: FQE progress bars.
        on_run: called with (index, run_dir) before each run (for messages).
        task: ``task.*`` values; only the reference scores matter here (see
            :func:`online_score`); the others are accepted, but offline
            selection never runs the environment.
        fit_dir: where a run's fits are cached (default ``<run_dir>/selection_fqe``).
        fqe_overrides: :class:`SelectionFQEConfig` fields overriding each run's
            defaults (:func:`fqe_config_for_run`), e.g. ``steps=2000``.

    Raises:
        SweepError: a run's files are unreadable.
        DatasetError: a run's dataset cannot be loaded.
    """
    device = torch.device(device)
    datasets: dict[str, Any] = {}
    scores = []
    for index, run_dir in enumerate(run_dirs):
        if on_run is not None:
            on_run(index, run_dir)
        config, results = read_run(run_dir)
        if "env" not in config:
            raise SweepError(
                f"{str(Path(run_dir) / 'config.json')!r} names no dataset ('env'); it was not "
                "written by cbop-train (scripts/cbop.py). Remove that directory from the sweep "
                "directory"
            )
        env = str(config["env"])
        if env not in datasets:
            data, info = load_dataset_with_info(env)
            datasets[env] = (data.to(device), info)
        data, info = datasets[env]
        # Offline selection never makes the environment; a module-qualified id is still
        # accepted only when the command line gives it (task.gym_id=...).
        given = task if isinstance(task, TaskConfig) else TaskConfig.from_dict(task)
        actor, _, meta = load_policy(policy_file(run_dir), device, given.gym_id)
        fqe_config = fqe_config_for_run(config, **fqe_overrides)
        seed = int(config.get("seed", 0))
        value = evaluate_policy_offline(
            data,
            actor,
            meta["obs_dim"],
            meta["action_dim"],
            fqe_config,
            seed,
            Path(run_dir) / "selection_fqe" if fit_dir is None else fit_dir(Path(run_dir)),
            {"data": info.fingerprint, "policy": _weights_digest(actor)},
            progress,
        )
        scores.append(
            RunScore(
                run_dir=Path(run_dir),
                env=env,
                dataset=info.name,
                seed=seed,
                settings=flatten_settings(config),
                fqe_value=value,
                online_score=online_score(results, task),
                policy_step=int(meta.get("step", 0)),
                fqe_settings=asdict(fqe_config),
            )
        )
    return scores


__all__ = [
    "Candidate",
    "online_score",
    "DatasetRanking",
    "RunScore",
    "flatten_settings",
    "fqe_config_for_run",
    "score_runs",
    "rank_runs",
    "SelectionFQEConfig",
    "average_ranks",
    "deterministic_actions",
    "episode_starts",
    "evaluate_policy_offline",
    "fit_policy_fqe",
    "initial_state_value",
    "make_fqe_loss",
    "policy_fqe_data",
    "spearman_rho",
]
