"""The run configuration: typed sections, the paper's settings table, validation.

Hydra composes ``cbop_torchrl/configs/config.yaml`` (a preset, a logger, the dynamics
group) and the command-line overrides into one tree; :func:`load_config`
turns that tree into a :class:`RunConfig` and checks it before any work
starts. Every problem found is reported at once in a :class:`ConfigError`.

Paper settings. A ``null`` in a table-fed field (``estimator.psi``,
``agent.num_qvalue_nets``, ...) means "the paper's value for this dataset":
:func:`paper_settings` supplies it from :data:`PAPER_PSI` and
:data:`PAPER_SHARED` (on a generated look-alike set listed in :data:`GENERATED_PSI`, psi is
the paper's offline choice for that set instead). ``preset=paper`` leaves every table-fed
field null; the CPU and debug presets set the compute sizes themselves and leave only
``estimator.psi`` (a property of the dataset, not of the budget) to the
table. Any value given on the command line is not null, so explicit
overrides always win. A D4RL id with no ``preset=`` selects the paper
preset (:func:`cbop_torchrl.cli.wants_paper_preset`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.registry import D4RL_KINDS, Task

PAPER_PSI: dict[str, dict[str, float]] = {
    "halfcheetah": {
        "random": 3.0,
        "medium": 0.5,
        "medium-replay": 0.5,
        "medium-expert": 3.0,
        "expert": 5.0,
        "full-replay": 2.0,
    },
    "hopper": {
        "random": 5.0,
        "medium": 3.0,
        "medium-replay": 2.0,
        "medium-expert": 3.0,
        "expert": 3.0,
        "full-replay": 3.0,
    },
    "walker2d": {
        "random": 5.0,
        "medium": 3.0,
        "medium-replay": 2.0,
        "medium-expert": 3.0,
        "expert": 3.0,
        "full-replay": 2.0,
    },
}
"""The paper's LCB coefficient psi per family and D4RL dataset kind (DESIGN.md section 1)."""

GENERATED_PSI: dict[str, float] = {"halfcheetah-medium-replay-gen": 3.0}
"""psi for ``estimator.psi: null`` on the generated look-alike sets (``scripts/collect.py``,
by the set's name) where the paper's own way of choosing it differs from its D4RL table: the
offline choice by FQE over the paper's grid {0.5, 2, 3, 5} (appendix C), made at the CPU
preset's sizes (``python benchmarks/psi_grid.py --select``; the choice, its candidates and
their scores are ``benchmarks/results/<set>/psi_selection.json``; docs/results.md). Sets not
listed keep the D4RL table's psi for their family and kind."""

PAPER_QVALUE_NETS = {"hopper": 50}
"""Q-ensemble size M where it differs from :data:`PAPER_DEFAULT_QVALUE_NETS`."""
PAPER_DEFAULT_QVALUE_NETS = 20

PAPER_SHARED: dict[str, Any] = {
    "estimator.horizon": 10,
    "dynamics.num_members": 30,
    "dynamics.num_elites": 20,
    "train.epochs": 1000,
    "train.steps_per_epoch": 1000,
    "train.batch_size": 256,
    "agent.actor_lr": 3e-4,
    "agent.critic_lr": 3e-4,
    "agent.alpha_lr": 3e-4,
}
"""Paper settings that do not depend on the dataset (appendix B/D)."""


class Choice(str, Enum):
    """A config key's allowed values; the schema (Hydra/OmegaConf) refuses anything else.

    Member names equal their values, so OmegaConf's error lists the values a
    user types ("expected one of [lcb, map, ...]") and ``enum_to_str`` gives
    back the plain strings the rest of the package compares against.
    """

    def __str__(self) -> str:
        return self.value


class EstimatorMode(Choice):
    lcb = "lcb"
    map = "map"
    fixed = "fixed"
    quantile = "quantile"


# ``lambda`` is a keyword, so this one is declared through the functional API.
FixedWeighting = Choice("FixedWeighting", [("uniform", "uniform"), ("lambda", "lambda")])


class QInit(Choice):
    """How the Q-networks' weights start (before FQE)."""

    torch = "torch"  # PyTorch's default Linear initialisation (TorchRL's MLP)
    authors = "authors"  # the authors' code: fan-in weights, hidden biases 0.1, last layer +-3e-3


class Termination(Choice):
    zero_precision = "zero_precision"
    absorb = "absorb"


class Sampling(Choice):
    shared = "shared"
    independent = "independent"


class RolloutDtype(Choice):
    float32 = "float32"
    bfloat16 = "bfloat16"
    auto = "auto"


class DynamicsActivation(Choice):
    """The dynamics ensemble's hidden activation (names of
    :func:`cbop_torchrl.modules.ensemble.make_activation`)."""

    silu = "silu"
    relu = "relu"
    tanh = "tanh"
    elu = "elu"


class EvalBackend(Choice):
    serial = "serial"
    parallel = "parallel"


class LoggerBackend(Choice):
    csv = "csv"
    wandb = "wandb"
    tensorboard = "tensorboard"
    none = "none"


class WandbMode(Choice):
    online = "online"
    offline = "offline"
    disabled = "disabled"


ESTIMATOR_MODES = tuple(choice.value for choice in EstimatorMode)
LOGGER_BACKENDS = tuple(choice.value for choice in LoggerBackend)
RESUME_CHOICES = ("auto", "true", "false")  # a str key: Hydra reads true/false as booleans
EVAL_BACKENDS = tuple(choice.value for choice in EvalBackend)
Q_INITS = tuple(choice.value for choice in QInit)


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem and how to fix it."""


@dataclass
class DynamicsConfig:
    """Dynamics ensemble architecture and training settings (paper defaults)."""

    num_members: int = 30
    num_elites: int = 20
    hidden_size: int = 200
    num_layers: int = 4
    activation: str = "silu"
    lr: float = 1e-3
    batch_size: int = 256
    holdout_ratio: float = 0.2
    max_holdout: int = 5000
    patience: int = 5
    improvement_threshold: float = 0.01
    max_epochs: int | None = None
    weight_decay: tuple[float, ...] = field(default=(2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4))
    logvar_bound_coef: float = 0.01
    seed: int = 0
    separate_reward: bool = False

    def __post_init__(self) -> None:
        self.weight_decay = tuple(float(d) for d in self.weight_decay)
        problems = []
        if not isinstance(self.separate_reward, bool):
            problems.append(f"separate_reward={self.separate_reward!r} must be true or false")
        if not 1 <= self.num_elites <= self.num_members:
            problems.append(
                f"num_elites={self.num_elites} must be between 1 and num_members={self.num_members}"
            )
        if len(self.weight_decay) != self.num_layers + 1:
            problems.append(
                f"weight_decay has {len(self.weight_decay)} entries but num_layers="
                f"{self.num_layers} needs {self.num_layers + 1} (one per hidden layer plus "
                "the output layer)"
            )
        if not 0.0 < self.holdout_ratio < 1.0 or self.max_holdout < 1:
            problems.append(
                f"holdout_ratio={self.holdout_ratio} must be in (0, 1) and max_holdout="
                f"{self.max_holdout} at least 1"
            )
        if self.max_epochs is not None and self.max_epochs < 1:
            problems.append(f"max_epochs={self.max_epochs} must be None or >= 1")
        if str(self.activation) not in {choice.value for choice in DynamicsActivation}:
            problems.append(
                f"activation={self.activation!r} must be one of "
                f"{', '.join(choice.value for choice in DynamicsActivation)}"
            )
        if min(self.batch_size, self.patience, self.hidden_size, self.num_layers) < 1:
            problems.append("batch_size, patience, hidden_size and num_layers must be >= 1")
        if problems:
            raise ValueError("invalid dynamics config: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DynamicsConfig:
        """Builds a config from a plain dict (e.g. a Hydra node), rejecting unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown dynamics config keys {unknown}; valid keys are {sorted(known)}"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["weight_decay"] = list(self.weight_decay)
        # Added after models were cached and runs hashed from this dict: named only when on,
        # so those cache entries and checkpoints still match.
        if not self.separate_reward:
            values.pop("separate_reward")
        return values


@dataclass
class AgentConfig:
    """The EDAC-style SAC trained with CBOP targets (actor, M Q-networks, alpha)."""

    num_qvalue_nets: int | None = None  # M; null: 50 for hopper, 20 otherwise
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256, 256])
    # The Q-networks' hidden widths; null: hidden_sizes (the paper uses one size for both).
    critic_hidden_sizes: list[int] | None = None
    q_init: QInit = QInit.torch
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float | None = None
    critic_lr: float | None = None
    alpha_lr: float | None = None
    alpha_init: float = 1.0
    eta: float = 1.0  # EDAC gradient-diversity weight
    bc_weight: float = 0.0  # beyond the paper (opt-in): weight of the actor's NLL of data actions
    # Beyond the paper (opt-in): weight of each member's Q(s, a_pi) - Q(s, a_data) in its loss.
    critic_penalty: float = 0.0
    critic_layer_norm: bool = False  # beyond the paper (opt-in): LayerNorm in the Q-networks
    # Beyond the paper (opt-in): beta of each Q-member's fixed random prior, Q_m = f_m + beta * p_m.
    critic_prior_scale: float = 0.0


@dataclass
class EstimatorConfig:
    """Arguments of :class:`CBOPValueEstimator` (see its docstring)."""

    mode: EstimatorMode = EstimatorMode.lcb
    psi: float | None = None
    horizon: int | None = None
    fixed_weighting: FixedWeighting = FixedWeighting["uniform"]
    lmbda: float = 0.9
    quantile: float = 0.3085
    termination: Termination = Termination.zero_precision
    sampling: Sampling = Sampling.shared  # shared | independent rollouts per horizon
    rollout_dtype: RolloutDtype = RolloutDtype.auto


@dataclass
class PretrainConfig:
    """Behaviour cloning or fitted Q evaluation before CBOP (DESIGN.md section 1)."""

    steps: int = 50_000
    batch_size: int = 256
    lr: float = 3e-4
    checkpoint_interval: int = 5_000


@dataclass
class FQEConfig(PretrainConfig):
    """FQE also has its target ensemble's Polyak rate.

    Each soft update moves the target a fraction ``target_tau`` towards the
    online ensemble, so ``steps * target_tau`` is roughly the number of
    value-iteration sweeps FQE gets; with gamma = 0.99 it needs a few hundred.
    """

    target_tau: float = 0.005
    rounds: int | None = None  # None: soft target updates; n: n rounds of hard-target FQE
    eta: float = 0.0  # beyond the paper (opt-in): EDAC's gradient-diversity weight during FQE
    # The authors' FQE (their pol_eval.py): each of the ``rounds`` rounds is fitted to
    # convergence instead of ``steps // rounds`` steps: epochs over the data (each member its
    # own resample per epoch), early stopping on ``holdout`` held-out rows after ``patience``
    # epochs without a relative improvement of ``improvement``, at most ``max_epochs``, and the
    # best held-out weights of each member kept. ``steps`` and ``target_tau`` are then unused.
    converge: bool = False
    max_epochs: int = 100
    patience: int = 5
    holdout: int = 1000
    improvement: float = 0.01

    # FQE as the paper's Algorithm 2 (Le et al. 2019): ``rounds`` rounds of
    # ``steps // rounds`` gradient steps, each regressing on targets from the
    # previous round's frozen ensemble (the target is copied at round starts;
    # target_tau is then unused). A few rounds leave Q at the scale of a
    # few-step return, as the authors' pretraining does (5 rounds in their README).


@dataclass
class TrainConfig:
    """The CBOP stage: ``epochs * steps_per_epoch`` gradient steps."""

    epochs: int | None = None
    steps_per_epoch: int | None = None
    batch_size: int | None = None
    checkpoint_interval: int = 5_000
    log_interval: int = 1_000

    @property
    def total_steps(self) -> int:
        return int(self.epochs) * int(self.steps_per_epoch)


@dataclass
class EvalConfig:
    """Evaluation of the deterministic policy on vectorized TorchRL environments."""

    episodes: int = 10
    interval: int = 10_000  # gradient steps between evaluations; 0 = only at the end
    max_steps: int = 1000
    # serial: one process (SerialEnv); parallel: ParallelEnv workers
    backend: EvalBackend = EvalBackend.serial
    diagnostics: bool = False  # also measure value error, policy drift, model error (diag/*)
    mc_states: int = 100  # dataset states of the conservatism (Q - MC) measurement; 0: none
    # also score every evaluation on one episode from each of this many dataset states restored
    # in the simulator (start_* in eval_history; envs/starts.py); 0: off
    start_states: int = 0
    # BEYOND THE PAPER (opt-in): also evaluate an exponential moving average of the actor's
    # weights with this decay per gradient step (eval/average_*); training is unchanged. 0: off
    actor_average: float = 0.0
    # evaluations during training in a worker thread on a copy of the weights, logged at the
    # step they measure; training does not wait for them (the diagnostics stay in-line)
    background: bool = False


@dataclass
class LoggerConfig:
    """A TorchRL logger (``torchrl.record.loggers``)."""

    backend: LoggerBackend = LoggerBackend.csv
    project: str = "cbop-torchrl"  # wandb project
    # wandb: online | offline (default: no account, no network) | disabled
    mode: WandbMode = WandbMode.offline
    entity: str | None = None  # wandb entity (team or user); None: the account's default
    group: str | None = None  # wandb group, e.g. one per sweep
    tags: list[str] = field(default_factory=list)  # wandb tags


@dataclass
class RunConfig:
    """Everything one run needs; built from the Hydra tree by :func:`load_config`."""

    env: str = "demo"
    preset: str = "cpu"
    seed: int = 0
    device: str = "auto"
    threads: int | None = None  # torch CPU threads; None: torch's default (all cores)
    compile: bool = False  # torch.compile of the target (CUDA graphs on CUDA, inductor on CPU)
    # the whole CBOP gradient step as one captured CUDA graph: null (auto) on a CUDA device,
    # true requires one, false never (trainers/update.py)
    cuda_graph: bool | None = None
    resume: str = "auto"
    progress: bool = True
    agent: AgentConfig = field(default_factory=AgentConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    dynamics: DynamicsConfig = field(default_factory=DynamicsConfig)
    bc: PretrainConfig = field(default_factory=PretrainConfig)
    fqe: FQEConfig = field(default_factory=FQEConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["dynamics"] = self.dynamics.to_dict()
        return values

    def training_dict(self) -> dict[str, Any]:
        """The settings that change what is trained (not where or how it is reported).

        Resuming a run whose checkpoint was written with other training
        settings is refused, except a larger budget (``train.epochs``,
        ``train.steps_per_epoch``: the run continues to the new last step, see
        :func:`~cbop_torchrl.trainers.checkpoint.check_resumable`); device,
        logger, evaluation and progress display may change between a run and
        its resumption.
        """
        values = self.to_dict()
        for key in (
            "device",
            "threads",
            "compile",
            "cuda_graph",
            "resume",
            "progress",
            "eval",
            "logger",
            "preset",
        ):
            values.pop(key)
        values["train"].pop("log_interval")
        values["train"].pop("checkpoint_interval")
        # Options added after runs existed count only when set, so that those runs'
        # checkpoints (hashed from this dict) still resume and their caches still match.
        for section, key, off in LATER_OPT_INS:
            if values[section][key] == off:
                values[section].pop(key)
        return values


#: ``(section, key, value that turns it off)`` of opt-in settings added after the first
#: checkpoints were written (see :meth:`RunConfig.training_dict`).
LATER_OPT_INS: tuple[tuple[str, str, Any], ...] = (
    ("agent", "bc_weight", 0.0),
    ("agent", "critic_penalty", 0.0),
    ("agent", "critic_layer_norm", False),
    ("agent", "critic_prior_scale", 0.0),
)

_SECTIONS: dict[str, type] = {
    "agent": AgentConfig,
    "estimator": EstimatorConfig,
    "bc": PretrainConfig,
    "fqe": FQEConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "logger": LoggerConfig,
    "task": TaskConfig,
}


def infer_dataset_kind(name: str) -> str | None:
    """The D4RL kind named in a dataset name (``hopper-medium-replay-gen`` -> ``medium-replay``).

    Longer kinds are tried first, so ``medium-expert`` is not read as ``medium``.
    Returns None when no kind appears in the name.
    """
    for kind in sorted(D4RL_KINDS, key=len, reverse=True):
        if re.search(rf"(^|[-_/]){re.escape(kind)}($|[-_/.])", name):
            return kind
    return None


def paper_settings(family: Task | str | None, kind: str | None) -> dict[str, Any]:
    """The paper's settings for one dataset, as dotted keys (``"estimator.psi"``: 2.0).

    ``estimator.psi`` is present only when ``kind`` is one of the D4RL kinds.
    """
    family_name = family.name if isinstance(family, Task) else family
    settings = dict(PAPER_SHARED)
    settings["agent.num_qvalue_nets"] = PAPER_QVALUE_NETS.get(
        family_name, PAPER_DEFAULT_QVALUE_NETS
    )
    if kind is not None and kind in PAPER_PSI.get(family_name, {}):
        settings["estimator.psi"] = PAPER_PSI[family_name][kind]
    return settings


def run_name(env: str) -> str:
    """A file-system friendly name for a dataset source (used for run directories)."""
    text = str(env)
    if text.startswith("minari:"):
        text = text[len("minari:") :]
    elif text.endswith((".hdf5", ".h5")):
        text = Path(text).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "dataset"


def _unknown_keys(values: Mapping[str, Any], known: type, where: str) -> list[str]:
    names = {f.name for f in dataclasses.fields(known)}
    unknown = sorted(set(values) - names)
    if not unknown:
        return []
    return [
        f"unknown key{'s' if len(unknown) > 1 else ''} "
        + ", ".join(f"{where}{key}" for key in unknown)
        + f" (valid keys in {where.rstrip('.') or 'the top level'}: {', '.join(sorted(names))})"
    ]


DatasetLookup = Callable[[str], tuple[Task | str | None, str]]
"""Maps ``env`` to its known family (None for other tasks) and clean dataset name; raises
when the dataset is missing."""


def load_config(
    values: Mapping[str, Any], lookup_dataset: DatasetLookup
) -> tuple[RunConfig, list[str]]:
    """The validated :class:`RunConfig` of a plain nested dict (the composed Hydra tree).

    Null table-fed fields are filled from :func:`paper_settings` for the dataset
    that ``lookup_dataset(values["env"])`` names.

    Returns:
        The config and the dotted keys that were filled from the paper table.

    Raises:
        ConfigError: listing every problem at once: unknown keys, a missing dataset
            (the message of the exception ``lookup_dataset`` raised), a null with no
            table value, psi < 0, H < 0, more elites than trained members,
            non-positive sizes, unknown choices.
    """
    values = copy.deepcopy(dict(values))
    values["threads"], note = capped_threads(values.get("threads"))
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    if values.get("progress") is None:  # the programs decide by the terminal; the API shows bars
        values["progress"] = True
    problems = _unknown_keys(values, RunConfig, "")
    for name, section_type in {**_SECTIONS, "dynamics": DynamicsConfig}.items():
        values[name] = dict(values.get(name) or {})
        problems += _unknown_keys(values[name], section_type, f"{name}.")

    filled: list[str] = []
    env = str(values.get("env", RunConfig.env))
    try:
        family, dataset_name = lookup_dataset(env)
    except Exception as error:  # the dataset layer's message says what is missing
        problems.append(f"env={env!r}: {error}")
    else:
        kind = infer_dataset_kind(dataset_name)
        table = paper_settings(family, kind)
        if dataset_name in GENERATED_PSI:  # the offline choice on a generated set
            table["estimator.psi"] = GENERATED_PSI[dataset_name]
        for dotted in [*table, "estimator.psi"]:
            section, _, key = dotted.partition(".")
            if values[section].get(key) is not None:
                continue
            if dotted in table:
                values[section][key] = table[dotted]
                filled.append(dotted)
            else:
                family_name = getattr(family, "name", family) or "not a known one"
                problems.append(
                    f"estimator.psi is null, which means 'the paper's psi for this dataset', "
                    f"but the paper has no psi for {dataset_name!r} (family {family_name}, "
                    f"kind {kind or 'unknown'}); pass estimator.psi=<value>, e.g. "
                    "estimator.psi=2.0"
                )

    sections = {}
    for name, section_type in _SECTIONS.items():
        known = {f.name for f in dataclasses.fields(section_type)}
        sections[name] = section_type(**{k: v for k, v in values[name].items() if k in known})
    dynamics_values = {
        k: v
        for k, v in values["dynamics"].items()
        if k in {f.name for f in dataclasses.fields(DynamicsConfig)}
    }
    problems += _check_ensemble_sizes(dynamics_values)
    try:
        dynamics = DynamicsConfig(**_dynamics_placeholders(dynamics_values))
    except (TypeError, ValueError) as error:
        problems.append(str(error))
        dynamics = DynamicsConfig()
    top = {
        f.name: values[f.name]
        for f in dataclasses.fields(RunConfig)
        if f.name in values and f.name not in sections and f.name != "dynamics"
    }
    config = RunConfig(dynamics=dynamics, **top, **sections)
    problems += range_problems({"dynamics": dynamics_values})  # as given, before placeholders
    problems += validate(config)
    if problems:
        raise ConfigError(_format(list(dict.fromkeys(problems))))
    return config, filled


def _check_ensemble_sizes(dynamics: Mapping[str, Any]) -> list[str]:
    members, elites = dynamics.get("num_members"), dynamics.get("num_elites")
    if isinstance(members, int) and isinstance(elites, int) and elites > members:
        return [
            f"dynamics.num_elites={elites} (K, the particles of the CBOP rollout) is larger "
            f"than the trained ensemble dynamics.num_members={members}; use K <= the number "
            "of trained members"
        ]
    return []


def _dynamics_placeholders(dynamics: Mapping[str, Any]) -> dict[str, Any]:
    """Sizes that keep ``DynamicsConfig`` constructible while other problems are reported."""
    values = dict(dynamics)
    for key in ("num_members", "num_elites"):
        if values.get(key) is None:
            values[key] = PAPER_SHARED[f"dynamics.{key}"]
    if values["num_elites"] > values["num_members"]:  # already reported by the size check
        values["num_elites"] = values["num_members"]
    return values


def _get(config: RunConfig, dotted: str) -> Any:
    section, _, name = dotted.partition(".")
    return getattr(getattr(config, section), name)


def _finite_non_negative(value: Any) -> bool:
    """A number (not a bool) in ``[0, inf)``; NaN is not."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < math.inf


def validate(config: RunConfig) -> list[str]:
    """Semantic checks of a filled config; returns the problems (empty when valid).

    Each setting's own range comes from the one table, :data:`SETTING_RANGES`
    (:func:`range_problems`); what is checked here besides is how settings fit together
    and the choices.
    """
    values = config.to_dict()
    problems = list(dict.fromkeys(range_problems(values) + not_a_number_or_empty(values)))
    estimator = config.estimator
    if config.agent.q_init not in Q_INITS:
        problems.append(f"agent.q_init={config.agent.q_init!r} must be one of {Q_INITS}")
    if config.fqe.converge and config.fqe.rounds is None:
        problems.append(
            "fqe.converge=true fits each FQE round to convergence and needs a number of rounds: "
            "add fqe.rounds=5 (the authors' README), or set fqe.converge=false"
        )
    if estimator.mode not in ESTIMATOR_MODES:
        problems.append(f"estimator.mode={estimator.mode!r} must be one of {ESTIMATOR_MODES}")
    if estimator.sampling not in ("shared", "independent"):
        problems.append(
            f"estimator.sampling={estimator.sampling!r} must be one of ('shared', 'independent')"
        )
    rounds = config.fqe.rounds
    if isinstance(rounds, int) and isinstance(config.fqe.steps, int) and rounds > config.fqe.steps:
        problems.append(
            f"fqe.rounds={rounds!r} must be null (soft target updates) or an integer from 1 to "
            f"fqe.steps={config.fqe.steps}"
        )
    dynamics = config.dynamics
    if (
        dynamics.num_members is not None
        and dynamics.num_elites is not None
        and dynamics.num_elites > dynamics.num_members
    ):
        problems.append(
            f"dynamics.num_elites={dynamics.num_elites} (K, the particles of the CBOP "
            f"rollout) is larger than the trained ensemble dynamics.num_members="
            f"{dynamics.num_members}; use K <= the number of trained members"
        )
    if config.eval.backend not in EVAL_BACKENDS:
        problems.append(f"eval.backend={config.eval.backend!r} must be one of {EVAL_BACKENDS}")
    if config.logger.backend not in LOGGER_BACKENDS:
        problems.append(
            f"logger.backend={config.logger.backend!r} must be one of {LOGGER_BACKENDS}"
        )
    project = config.logger.project
    if config.logger.backend == "wandb" and (
        not isinstance(project, str)
        or not 0 < len(project) <= 128
        or any(char in WANDB_PROJECT_FORBIDDEN for char in project)
    ):
        problems.append(
            f"logger.project={project!r} is not a wandb project name: 1 to 128 characters, "
            f"none of {' '.join(WANDB_PROJECT_FORBIDDEN)} (e.g. logger.project=cbop-torchrl)"
        )
    if config.logger.mode not in ("online", "offline", "disabled"):
        problems.append(
            f"logger.mode={config.logger.mode!r} must be one of online, offline, disabled"
        )
    if str(config.resume).lower() not in RESUME_CHOICES:
        problems.append(f"resume={config.resume!r} must be one of auto, true, false")
    if config.device not in ("auto", "cpu", "cuda") and not str(config.device).startswith("cuda:"):
        problems.append(f"device={config.device!r} must be auto, cpu, cuda or cuda:<index>")
    elif str(config.device).startswith("cuda") and not torch.cuda.is_available():
        problems.append(
            f"device={config.device} was requested but torch sees no CUDA device "
            "(torch.cuda.is_available() is False); use device=auto (CUDA when present, else "
            "the CPU) or device=cpu"
        )
    on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    if config.cuda_graph and on_cpu:
        problems.append(
            "cuda_graph=true captures the CBOP step as a CUDA graph, which needs device=cuda on "
            "a machine with a GPU; drop cuda_graph=true (the default, cuda_graph=null, captures "
            "whenever the device is CUDA)"
        )
    if config.cuda_graph and config.compile:
        problems.append(
            "cuda_graph=true and compile=true both ask for CUDA graphs, which cannot nest; use "
            "cuda_graph=true compile=false (the whole step) or cuda_graph=false compile=true"
        )
    return problems


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def capped_threads(threads: int | None) -> tuple[int | None, str | None]:
    """``threads`` capped at :func:`usable_cores`, with a note when it was capped.

    More torch threads than cores only make them wait for each other (``threads=1000``
    ran 5x slower than the default).
    """
    cores = usable_cores()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads <= cores:
        return threads, None
    return cores, (
        f"threads={threads} is more than the {cores} CPU core{'s' * (cores != 1)} this process "
        f"may use; using threads={cores}"
    )


#: Characters wandb does not accept in a project name.
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


SEED_RANGE = (0, 2**32 - 1)
"""The seeds NumPy (and so every seeded part of a run) accepts."""


def not_a_number_or_empty(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Values no setting of any program takes, anywhere in a config dict (the schema lets them
    through): NaN and infinite numbers, empty strings, and a ``seed`` outside
    :data:`SEED_RANGE`."""
    problems = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if key != "gym_kwargs":  # keyword arguments of gymnasium.make: not ours to judge
                problems += not_a_number_or_empty(value, f"{name}.")
        elif isinstance(value, float) and math.isnan(value):
            problems.append(f"{name}=nan is not a number; give a finite value")
        elif isinstance(value, float) and math.isinf(value):
            problems.append(f"{name}={value} is not finite; give a finite value")
        elif isinstance(value, str) and not value.strip():
            problems.append(f"{name} is an empty string; give it a value")
        elif (
            key == "seed"
            and isinstance(value, int)
            and not isinstance(value, bool)
            and not SEED_RANGE[0] <= value <= SEED_RANGE[1]
        ):
            problems.append(
                f"{name}={value} must be an integer from {SEED_RANGE[0]} to 2**32 - 1 "
                f"({SEED_RANGE[1]}), e.g. {name}=0"
            )
    return problems


# ------------------------------------------------------------------------- ranges, one table


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric setting, wherever a program has it.

    ``key``: the dotted key as the programs' configs spell it (``dynamics.lr``,
    ``compression_level``, ``algo.expectile``); ``low``/``high``: the bounds (None: none),
    open when ``low_open``/``high_open``; ``integer``: whole numbers only; ``items``: the
    value is a list whose every item holds the bounds and which has at least ``min_items``
    items; ``reason``: why (the message adds it with an example).
    """

    key: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    reason: str = ""
    items: bool = False
    min_items: int = 1

    def describe(self) -> str:
        """``an integer >= 1``, ``a number in (0, 1]``, ``a positive number``, ..."""
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind} in {left}{self.low:g}, {self.high:g}{right}"
        elif self.low is not None:
            if self.low == 0 and self.low_open and not self.integer:
                text = "a positive number"
            else:
                text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = f"a finite {kind.split()[1]}"
        if self.items:
            plural = "s" * (self.min_items != 1)
            text = f"a list of at least {self.min_items} item{plural}, each {text}"
        return text

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is allowed (None is left to the schema: nullable keys)."""
        if self.items:
            return (
                isinstance(value, (list, tuple))
                and len(value) >= self.min_items
                and all(self._number_holds(item) for item in value)
            )
        return self._number_holds(value)

    def _number_holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value) or (self.integer and value != int(value)):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


def _positive(key: str, reason: str = "", integer: bool = False) -> Range:
    if integer:
        return Range(key, 1, integer=True, reason=reason)
    return Range(key, 0, low_open=True, reason=reason)


def _non_negative(key: str, reason: str = "", integer: bool = False) -> Range:
    return Range(key, 0, integer=integer, reason=reason)


def _fraction(key: str, reason: str = "", high_open: bool = True) -> Range:
    return Range(key, 0, 1, low_open=True, high_open=high_open, reason=reason)


_LR = "a learning rate; 0 would train nothing, e.g. {key}=0.0003"
_SIZE = "a count of steps, rows or networks, e.g. {key}={example}"

SETTING_RANGES: tuple[Range, ...] = (
    # every program
    _positive("threads", "torch CPU threads, or null for torch's default", integer=True),
    # cbop-train and cbop-baseline: the run config
    *(_positive(f"train.{k}", _SIZE, integer=True)
      for k in ("epochs", "steps_per_epoch", "batch_size", "checkpoint_interval", "log_interval")),
    *(_positive(f"{s}.{k}", _SIZE, integer=True)
      for s in ("bc", "fqe") for k in ("steps", "batch_size", "checkpoint_interval")),
    _positive("bc.lr", _LR),
    _positive("fqe.lr", _LR),
    _fraction("fqe.target_tau", "the target ensemble's Polyak rate: each soft update moves it "
              "this fraction towards the online ensemble; above 1 it overshoots, e.g. "
              "fqe.target_tau=0.005", high_open=False),
    _positive("fqe.rounds", "rounds of hard-target FQE, or null for soft updates", integer=True),
    _non_negative("fqe.eta", "EDAC's gradient-diversity weight during FQE; 0: the paper's FQE"),
    *(_positive(f"fqe.{k}", _SIZE, integer=True) for k in ("max_epochs", "patience", "holdout")),
    _fraction("fqe.improvement", "the relative held-out improvement that counts, e.g. "
              "fqe.improvement=0.01"),
    Range("agent.num_qvalue_nets", 2, integer=True, reason="CBOP's Q-ensemble needs at least 2 "
          "members (its target uses their spread); e.g. agent.num_qvalue_nets=10, or null for "
          "the paper's value"),
    Range("agent.hidden_sizes", 1, integer=True, items=True,
          reason="the actor's hidden layer widths, e.g. agent.hidden_sizes=[256,256]"),
    Range("agent.critic_hidden_sizes", 1, integer=True, items=True,
          reason="the Q-networks' widths, or null for agent.hidden_sizes, e.g. "
          "agent.critic_hidden_sizes=[128,128]"),
    _fraction("agent.gamma", "the discount, e.g. agent.gamma=0.99", high_open=False),
    _fraction("agent.tau", "the critics' Polyak rate, e.g. agent.tau=0.005", high_open=False),
    _positive("agent.actor_lr", _LR),
    _non_negative("agent.critic_lr", "null: the paper's 3e-4; 0 freezes the critics at their "
                  "FQE values, a control run"),
    _positive("agent.alpha_lr", _LR),
    _positive("agent.alpha_init", "SAC's initial entropy temperature, e.g. agent.alpha_init=1.0"),
    _non_negative("agent.eta", "EDAC's gradient-diversity weight; the paper's is agent.eta=1.0, "
                  "0 turns it off"),
    _non_negative("agent.bc_weight", "0: the paper's actor; e.g. agent.bc_weight=2.5"),
    _non_negative("agent.critic_penalty", "0: the paper's critic; e.g. agent.critic_penalty=0.5"),
    _non_negative("agent.critic_prior_scale", "0: the paper's critics, no prior networks; e.g. "
                  "agent.critic_prior_scale=1.0"),
    _non_negative("estimator.psi", "0 gives the posterior mean, larger values a more "
                  "conservative lower confidence bound; e.g. estimator.psi=2.0"),
    _non_negative("estimator.horizon", "the rollout length H; 0 gives the model-free target",
                  integer=True),
    _fraction("estimator.lmbda", "the lambda of fixed_weighting=lambda, e.g. estimator.lmbda=0.9"),
    _fraction("estimator.quantile", "the quantile of mode=quantile, e.g. "
              "estimator.quantile=0.3085"),
    _positive("eval.episodes", "episodes run side by side, e.g. eval.episodes=10", integer=True),
    _non_negative("eval.interval", "gradient steps between evaluations; 0: only at the end",
                  integer=True),
    _positive("eval.max_steps", "the episode cap, e.g. eval.max_steps=1000", integer=True),
    _non_negative("eval.mc_states", "dataset states of the Q - MC measurement; 0: none",
                  integer=True),
    _non_negative("eval.start_states", "dataset states also evaluated from; 0: off",
                  integer=True),
    Range("eval.actor_average", 0, 1, high_open=True, reason="0: off; e.g. "
          "eval.actor_average=0.999 averages over about the last 1,000 gradient steps"),
    # the dynamics ensemble (cbop-train, cbop-baseline's pipeline, cbop-train-dynamics)
    *(_positive(f"dynamics.{k}", _SIZE, integer=True)
      for k in ("num_members", "num_elites", "hidden_size", "num_layers", "batch_size",
                "max_holdout", "patience", "max_epochs")),
    _positive("dynamics.lr", _LR.replace("0.0003", "0.001")),
    Range("dynamics.weight_decay", 0, items=True, reason="each layer's L2 weight decay, one "
          "per hidden layer plus the output layer, e.g. "
          "dynamics.weight_decay=[2.5e-5,5e-5,7.5e-5,7.5e-5,1e-4]"),
    _fraction("dynamics.holdout_ratio", "the share of rows held out, e.g. "
              "dynamics.holdout_ratio=0.2"),
    Range("dynamics.improvement_threshold", 0, 1, high_open=True, reason="the relative "
          "held-out improvement that counts, e.g. dynamics.improvement_threshold=0.01"),
    _non_negative("dynamics.logvar_bound_coef", "the weight of the log-variance bounds' "
                  "penalty, e.g. dynamics.logvar_bound_coef=0.01"),
    # cbop-baseline's algo section
    _positive("algo.num_qvalue_nets", "e.g. algo.num_qvalue_nets=2", integer=True),
    _positive("algo.policy_delay", "e.g. algo.policy_delay=2", integer=True),
    _non_negative("algo.alpha", "TD3+BC's weight of Q against BC, e.g. algo.alpha=2.5"),
    _non_negative("algo.policy_noise", "e.g. algo.policy_noise=0.2"),
    _non_negative("algo.noise_clip", "e.g. algo.noise_clip=0.5"),
    _non_negative("algo.temperature", "IQL's advantage temperature beta: 0 is plain BC, larger "
                  "values follow the advantage more; e.g. algo.temperature=3.0"),
    _fraction("algo.expectile", "e.g. algo.expectile=0.7"),
    _positive("algo.value_lr", "e.g. algo.value_lr=0.0003"),
    _non_negative("algo.min_q_weight", "e.g. algo.min_q_weight=5.0"),
    _positive("algo.num_random", "CQL's random actions per state, e.g. algo.num_random=10",
              integer=True),
    _positive("algo.cql_temperature", "e.g. algo.cql_temperature=1.0"),
    Range("algo.lagrange_thresh", reason="e.g. algo.lagrange_thresh=10.0"),
    # cbop-evaluate
    _positive("episodes", "episodes run side by side, e.g. episodes=10", integer=True),
    _positive("max_steps", "the episode cap, e.g. max_steps=1000", integer=True),
    # cbop-select-psi
    _positive("steps", "FQE gradient steps per run, or null for each run's fqe.steps",
              integer=True),
    _positive("batch_size", "FQE's batch size, or null for each run's fqe.batch_size",
              integer=True),
    Range("qvalue_nets", 2, integer=True, reason="the fitted Q-ensemble's members: FQE "
          "trains each on its own bootstrap resample and needs at least 2, e.g. qvalue_nets=2"),
    # cbop-collect
    Range("compression_level", 0, 9, integer=True, reason="gzip's level, e.g. "
          "compression_level=4"),
    _fraction("medium_fraction", "e.g. medium_fraction=0.333", high_open=False),
    _positive("rollout_transitions", "e.g. rollout_transitions=1000000", integer=True),
    _positive("num_threads", "e.g. num_threads=1", integer=True),
    Range("medium_min_normalized", reason="a floor on the medium policy's normalized score, "
          "or null"),
    *(_positive(f"sac.{k}", _SIZE, integer=True)
      for k in ("total_steps", "frames_per_batch", "checkpoint_every", "eval_episodes",
                "batch_size")),
    _non_negative("sac.warmup_steps", "uniform random steps before the policy acts",
                  integer=True),
    _positive("sac.lr", _LR),
    _fraction("sac.gamma", "the discount, e.g. sac.gamma=0.99", high_open=False),
    _fraction("sac.tau", "the critics' Polyak rate, e.g. sac.tau=0.005", high_open=False),
    Range("sac.hidden_sizes", 1, integer=True, items=True,
          reason="hidden layer widths, e.g. sac.hidden_sizes=[256,256]"),
    _positive("sac.max_episode_steps", "or null for the family's cap", integer=True),
    # every program's task section
    _positive("task.max_episode_steps", "or null for the family's cap", integer=True),
)  # fmt: skip
"""Every numeric setting of every program and its allowed range, in one place: checked
before any work by :func:`range_problems` (every entry point through
:func:`cbop_torchrl.cli.hydra_entry`, and :func:`load_config` for the Python API)."""

RANGES: dict[str, Range] = {entry.key: entry for entry in SETTING_RANGES}


def range_problems(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """One line for each setting of ``values`` (a program's config as plain values) outside
    its range in :data:`SETTING_RANGES`; None values are left to the schema (nullable keys)."""
    problems = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if key != "gym_kwargs":
                problems += range_problems(value, f"{name}.")
            continue
        entry = RANGES.get(name)
        if entry is None or value is None or entry.holds(value):
            continue
        if isinstance(value, float) and not math.isfinite(value):  # as not_a_number_or_empty
            problems += not_a_number_or_empty({key: value}, prefix)
            continue
        shown = list(value) if isinstance(value, (list, tuple)) else value
        reason = entry.reason.format(key=name, example=_EXAMPLES.get(name.rpartition(".")[2], 1))
        problems.append(
            f"{name}={_shown(shown)} must be {entry.describe()}{f' ({reason})' if reason else ''}"
        )
    return problems


_EXAMPLES = {"batch_size": 256, "steps": 50000, "checkpoint_interval": 5000, "epochs": 100,
             "steps_per_epoch": 1000, "log_interval": 1000, "num_members": 30,
             "num_elites": 20, "hidden_size": 200, "num_layers": 4, "max_holdout": 5000,
             "patience": 5, "max_epochs": 100, "holdout": 1000, "total_steps": 100000,
             "frames_per_batch": 1000, "checkpoint_every": 5000, "eval_episodes": 10}  # fmt: skip


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_shown(item) for item in value) + "]"
    return repr(value) if isinstance(value, str) else f"{value}"


def _format(problems: list[str]) -> str:
    problems = [problem.rstrip(". ") for problem in problems]
    if len(problems) == 1:
        return f"invalid configuration: {problems[0]}."
    return "invalid configuration:\n" + "\n".join(f"  - {p}." for p in problems)
