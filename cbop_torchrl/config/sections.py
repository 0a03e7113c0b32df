"""The run configuration's sections: typed dataclasses, each with its own checks.

Each section holds its settings, a table of their ranges (``RANGES``: :class:`Range` entries
of key, range and reason, checked by :meth:`RunConfig.range_problems`) and
:meth:`~Section.problems`: its choices and the settings that must fit together.
:func:`cbop_torchrl.config.validate` composes them; :func:`cbop_torchrl.config.load_config`
builds a :class:`RunConfig` from the composed Hydra tree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from cbop_torchrl.config.choices import (
    ACTIVATIONS,
    DEVICE_CHOICES,
    EVAL_BACKENDS,
    LOGGER_BACKENDS,
    MODES,
    Q_INITS,
    RESUME_CHOICES,
    SAMPLINGS,
    WANDB_MODES,
    EstimatorMode,
    EvalBackend,
    FixedWeighting,
    LoggerBackend,
    QInit,
    RolloutDtype,
    Sampling,
    Termination,
    WandbMode,
)
from cbop_torchrl.config.ranges import (
    LR,
    SIZE,
    Range,
    check_ranges,
    fraction,
    non_negative,
    positive,
)
from cbop_torchrl.envs.task import TaskConfig

#: Characters wandb does not accept in a project name.
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


class Section:
    """A section of the run config: its table of ranges and its own checks."""

    RANGES: ClassVar[tuple[Range, ...]] = ()
    """The section's numeric settings and their ranges, by the key within the section."""

    def problems(self) -> list[str]:
        """The section's choices and settings that do not fit together; empty when valid."""
        return []


def prefixed(table: tuple[Range, ...], prefix: str = "") -> dict[str, Range]:
    """A table by dotted key (``prefix``: the section's place, ``fqe.``)."""
    return {f"{prefix}{entry.key}": entry for entry in table}


def ensemble_size_problems(members: int, elites: int) -> list[str]:
    """More elites K (the particles of the CBOP rollout) than trained members."""
    if elites <= members:
        return []
    return [
        f"dynamics.num_elites={elites} (K, the particles of the CBOP rollout) is larger "
        f"than the trained ensemble dynamics.num_members={members}; use K <= the number "
        "of trained members"
    ]


@dataclass
class DynamicsConfig(Section):
    """Dynamics ensemble architecture and training settings (paper defaults)."""

    num_members: int = 30
    num_elites: int = 20
    hidden_size: int = 200  # width of each hidden layer
    num_layers: int = 4
    activation: str = "silu"
    lr: float = 1e-3  # Adam learning rate
    batch_size: int = 256
    holdout_ratio: float = 0.2
    max_holdout: int = 5000  # at most this many held-out rows (see holdout_ratio)
    patience: int = 5
    improvement_threshold: float = 0.01
    max_epochs: int | None = None  # at most this many training epochs
    weight_decay: tuple[float, ...] = field(default=(2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4))
    logvar_bound_coef: float = 0.01
    seed: int = 0  # seed of the ensemble's training; the configs set it to the run's seed
    separate_reward: bool = False
    bootstrap_per_epoch: bool = False  # the authors': each member's resample redrawn every epoch
    shared_logvar_bounds: bool = False  # the authors': one log-variance bound pair for all members

    RANGES = (
        *(positive(k, SIZE, integer=True)
          for k in ("num_members", "num_elites", "hidden_size", "num_layers", "batch_size",
                    "max_holdout", "patience", "max_epochs")),
        positive("lr", LR.replace("0.0003", "0.001")),
        Range("weight_decay", 0, items=True, reason="each layer's L2 weight decay, one "
              "per hidden layer plus the output layer, e.g. "
              "dynamics.weight_decay=[2.5e-5,5e-5,7.5e-5,7.5e-5,1e-4]"),
        fraction("holdout_ratio", "the share of rows held out, e.g. dynamics.holdout_ratio=0.2"),
        Range("improvement_threshold", 0, 1, high_open=True, reason="the relative "
              "held-out improvement that counts, e.g. dynamics.improvement_threshold=0.01"),
        non_negative("logvar_bound_coef", "the weight of the log-variance bounds' "
                     "penalty, e.g. dynamics.logvar_bound_coef=0.01"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        self.weight_decay = tuple(float(d) for d in self.weight_decay)
        problems = []
        for flag in ("separate_reward", *LATER_DYNAMICS_FLAGS):
            if not isinstance(getattr(self, flag), bool):
                problems.append(f"{flag}={getattr(self, flag)!r} must be true or false")
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
        if str(self.activation) not in ACTIVATIONS:
            problems.append(
                f"activation={self.activation!r} must be one of {', '.join(ACTIVATIONS)}"
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
        for flag in ("separate_reward", *LATER_DYNAMICS_FLAGS):
            if not values[flag]:
                values.pop(flag)
        return values

    def problems(self) -> list[str]:
        if self.num_members is None or self.num_elites is None:
            return []
        return ensemble_size_problems(self.num_members, self.num_elites)


@dataclass
class AgentConfig(Section):
    """The EDAC-style SAC trained with CBOP targets (actor, M Q-networks, alpha)."""

    num_qvalue_nets: int | None = None  # M; null: 50 for hopper, 20 otherwise
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256, 256])  # actor's widths
    # The Q-networks' hidden widths; null: hidden_sizes (the paper uses one size for both).
    critic_hidden_sizes: list[int] | None = None
    q_init: QInit = QInit.torch
    gamma: float = 0.99  # discount
    tau: float = 0.005  # the target Q-ensemble's Polyak rate
    actor_lr: float | None = None  # the actor's Adam learning rate
    critic_lr: float | None = None  # the Q-ensemble's Adam learning rate; 0 freezes it
    alpha_lr: float | None = None  # the entropy temperature's Adam learning rate
    alpha_init: float = 1.0  # SAC's initial entropy temperature alpha
    eta: float = 1.0  # EDAC gradient-diversity weight
    bc_weight: float = 0.0  # beyond the paper (opt-in): weight of the actor's NLL of data actions
    # Beyond the paper (opt-in): weight of each member's Q(s, a_pi) - Q(s, a_data) in its loss.
    critic_penalty: float = 0.0
    critic_layer_norm: bool = False  # beyond the paper (opt-in): LayerNorm in the Q-networks
    # Beyond the paper (opt-in): beta of each Q-member's fixed random prior, Q_m = f_m + beta * p_m.
    critic_prior_scale: float = 0.0

    RANGES = (
        Range("num_qvalue_nets", 2, integer=True, reason="CBOP's Q-ensemble needs at least 2 "
              "members (its target uses their spread); e.g. agent.num_qvalue_nets=10, or null "
              "for the paper's value"),
        Range("hidden_sizes", 1, integer=True, items=True,
              reason="the actor's hidden layer widths, e.g. agent.hidden_sizes=[256,256]"),
        Range("critic_hidden_sizes", 1, integer=True, items=True,
              reason="the Q-networks' widths, or null for agent.hidden_sizes, e.g. "
              "agent.critic_hidden_sizes=[128,128]"),
        fraction("gamma", "the discount, e.g. agent.gamma=0.99", high_open=False),
        fraction("tau", "the critics' Polyak rate, e.g. agent.tau=0.005", high_open=False),
        positive("actor_lr", LR),
        non_negative("critic_lr", "null: the paper's 3e-4; 0 freezes the critics at their "
                     "FQE values, a control run"),
        positive("alpha_lr", LR),
        positive("alpha_init", "SAC's initial entropy temperature, e.g. agent.alpha_init=1.0"),
        non_negative("eta", "EDAC's gradient-diversity weight; the paper's is agent.eta=1.0, "
                     "0 turns it off"),
        non_negative("bc_weight", "0: the paper's actor; e.g. agent.bc_weight=2.5"),
        non_negative("critic_penalty", "0: the paper's critic; e.g. agent.critic_penalty=0.5"),
        non_negative("critic_prior_scale", "0: the paper's critics, no prior networks; e.g. "
                     "agent.critic_prior_scale=1.0"),
    )  # fmt: skip

    def problems(self) -> list[str]:
        if self.q_init not in Q_INITS:
            return [f"agent.q_init={self.q_init!r} must be one of {Q_INITS}"]
        return []


@dataclass
class EstimatorConfig(Section):
    """Arguments of :class:`CBOPValueEstimator` (see its docstring)."""

    mode: EstimatorMode = EstimatorMode.lcb
    psi: float | None = None  # the LCB coefficient psi: larger is more conservative
    horizon: int | None = None  # the rollout length H
    fixed_weighting: FixedWeighting = FixedWeighting["uniform"]
    lmbda: float = 0.9  # fixed_weighting=lambda: horizon h weighs lmbda^h
    quantile: float = 0.3085
    termination: Termination = Termination.zero_precision
    sampling: Sampling = Sampling.shared  # shared | independent rollouts per horizon
    rollout_dtype: RolloutDtype = RolloutDtype.auto
    # The authors' code: each horizon's variance over its K x M samples with the n - 1 divisor
    # (torch.var's default; false: the population variance, the paper's equations).
    unbiased_variance: bool = False

    RANGES = (
        non_negative("psi", "0 gives the posterior mean, larger values a more conservative "
                     "lower confidence bound; e.g. estimator.psi=2.0"),
        non_negative("horizon", "the rollout length H; 0 gives the model-free target",
                     integer=True),
        fraction("lmbda", "the lambda of fixed_weighting=lambda, e.g. estimator.lmbda=0.9"),
        fraction("quantile", "the quantile of mode=quantile, e.g. estimator.quantile=0.3085"),
    )  # fmt: skip

    def problems(self) -> list[str]:
        problems = []
        if self.mode not in MODES:
            problems.append(f"estimator.mode={self.mode!r} must be one of {MODES}")
        if self.sampling not in SAMPLINGS:
            problems.append(f"estimator.sampling={self.sampling!r} must be one of {SAMPLINGS}")
        return problems


@dataclass
class PretrainConfig(Section):
    """Behaviour cloning or fitted Q evaluation before CBOP (DESIGN.md section 1)."""

    steps: int = 50_000  # gradient steps
    batch_size: int = 256  # dataset rows per gradient step
    lr: float = 3e-4  # Adam learning rate
    checkpoint_interval: int = 5_000  # gradient steps between checkpoints (a rerun resumes)

    RANGES = (
        *(positive(k, SIZE, integer=True) for k in ("steps", "batch_size", "checkpoint_interval")),
        positive("lr", LR),
    )


@dataclass
class BCConfig(PretrainConfig):
    """Behaviour cloning; ``converge`` gives the authors' scheme (their behavior_clone.py)."""

    # true: the authors' BC, epochs (each a resample of the training rows with replacement) until
    # `patience` epochs pass without a relative held-out NLL improvement of `improvement`, at most
    # `max_epochs`, on `holdout` held-out rows, best held-out weights kept; `steps` is then unused
    converge: bool = False
    max_epochs: int = 100  # converge=true: the most epochs
    patience: int = 5  # converge=true: epochs without improvement before it stops
    holdout: int = 1000  # converge=true: held-out rows, at most a fifth of the data
    improvement: float = 0.01  # converge=true: the relative held-out improvement that counts

    RANGES = (
        *PretrainConfig.RANGES,
        *(positive(k, SIZE, integer=True) for k in ("max_epochs", "patience", "holdout")),
        fraction("improvement", "the relative held-out improvement that counts, e.g. "
                 "bc.improvement=0.01"),
    )  # fmt: skip

    def cache_fields(self) -> dict[str, Any]:
        """The fields that decide what is trained; ``converge``'s only when on (old keys match)."""
        values = dict(vars(self))
        if not self.converge:
            for key in BC_CONVERGE_FIELDS:
                values.pop(key)
        return values


#: Fields added after runs existed, hashed only when on: earlier caches and checkpoints match.
BC_CONVERGE_FIELDS = ("converge", "max_epochs", "patience", "holdout", "improvement")
LATER_DYNAMICS_FLAGS = ("bootstrap_per_epoch", "shared_logvar_bounds")


@dataclass
class FQEConfig(PretrainConfig):
    """FQE also has its target ensemble's Polyak rate.

    Each soft update moves the target a fraction ``target_tau`` towards the online ensemble,
    so ``steps * target_tau`` is roughly the number of value-iteration sweeps FQE gets; with
    gamma = 0.99 it needs a few hundred.
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
    max_epochs: int = 100  # converge=true: at most this many epochs per round
    patience: int = 5  # converge=true: epochs without improvement that end a round
    holdout: int = 1000  # converge=true: held-out dataset rows for early stopping
    improvement: float = 0.01  # converge=true: the relative held-out improvement that counts
    drop_terminal: bool = False  # the authors': FQE fits no terminal rows (false: it fits them)

    # FQE as the paper's Algorithm 2 (Le et al. 2019): ``rounds`` rounds of
    # ``steps // rounds`` gradient steps, each regressing on targets from the
    # previous round's frozen ensemble (the target is copied at round starts;
    # target_tau is then unused). A few rounds leave Q at the scale of a
    # few-step return, as the authors' pretraining does (5 rounds in their README).

    RANGES = (
        *PretrainConfig.RANGES,
        fraction("target_tau", "the target ensemble's Polyak rate: each soft update moves it "
                 "this fraction towards the online ensemble; above 1 it overshoots, e.g. "
                 "fqe.target_tau=0.005", high_open=False),
        positive("rounds", "rounds of hard-target FQE, or null for soft updates", integer=True),
        non_negative("eta", "EDAC's gradient-diversity weight during FQE; 0: the paper's FQE"),
        *(positive(k, SIZE, integer=True) for k in ("max_epochs", "patience", "holdout")),
        fraction("improvement", "the relative held-out improvement that counts, e.g. "
                 "fqe.improvement=0.01"),
    )  # fmt: skip

    def problems(self) -> list[str]:
        problems = []
        if self.converge and self.rounds is None:
            problems.append(
                "fqe.converge=true fits each FQE round to convergence and needs a number of "
                "rounds: add fqe.rounds=5 (the authors' README), or set fqe.converge=false"
            )
        rounds = self.rounds
        if isinstance(rounds, int) and isinstance(self.steps, int) and rounds > self.steps:
            problems.append(
                f"fqe.rounds={rounds!r} must be null (soft target updates) or an integer from 1 "
                f"to fqe.steps={self.steps}"
            )
        return problems


@dataclass
class TrainConfig(Section):
    """The CBOP stage: ``epochs * steps_per_epoch`` gradient steps."""

    epochs: int | None = None  # CBOP epochs
    steps_per_epoch: int | None = None  # gradient steps per epoch
    batch_size: int | None = None  # dataset rows per CBOP gradient step
    checkpoint_interval: int = 5_000  # gradient steps between checkpoints (a rerun resumes)
    log_interval: int = 1_000  # gradient steps between logged training metrics

    RANGES = tuple(
        positive(k, SIZE, integer=True)
        for k in ("epochs", "steps_per_epoch", "batch_size", "checkpoint_interval", "log_interval")
    )

    @property
    def total_steps(self) -> int:
        return int(self.epochs) * int(self.steps_per_epoch)


@dataclass
class EvalConfig(Section):
    """Evaluation of the deterministic policy on vectorized TorchRL environments."""

    episodes: int = 10  # episodes per evaluation, run side by side
    interval: int = 10_000  # gradient steps between evaluations; 0 = only at the end
    max_steps: int = 1000  # the episode cap
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
    # every this many gradient steps (and at the last) write <run dir>/snapshots/step<k>.pt: the
    # actor's weights and the critics' Q at 100 fixed dataset states, scored afterwards by
    # cbop-score (trainers/snapshots.py); 0: off
    snapshot_interval: int = 0

    RANGES = (
        positive("episodes", "episodes run side by side, e.g. eval.episodes=10", integer=True),
        non_negative("interval", "gradient steps between evaluations; 0: only at the end",
                     integer=True),
        positive("max_steps", "the episode cap, e.g. eval.max_steps=1000", integer=True),
        non_negative("mc_states", "dataset states of the Q - MC measurement; 0: none",
                     integer=True),
        non_negative("start_states", "dataset states also evaluated from; 0: off", integer=True),
        non_negative("snapshot_interval", "gradient steps between snapshots, e.g. "
                     "eval.snapshot_interval=2500; 0: off", integer=True),
        Range("actor_average", 0, 1, high_open=True, reason="0: off; e.g. "
              "eval.actor_average=0.999 averages over about the last 1,000 gradient steps"),
    )  # fmt: skip

    def problems(self) -> list[str]:
        if self.backend not in EVAL_BACKENDS:
            return [f"eval.backend={self.backend!r} must be one of {EVAL_BACKENDS}"]
        return []


@dataclass
class LoggerConfig(Section):
    """A TorchRL logger (``torchrl.record.loggers``)."""

    backend: LoggerBackend = LoggerBackend.csv  # where metrics go; set by the logger group
    project: str = "cbop-torchrl"  # wandb project
    # wandb: online | offline (default: no account, no network) | disabled
    mode: WandbMode = WandbMode.offline
    entity: str | None = None  # wandb entity (team or user); null: the account's default
    group: str | None = None  # wandb group, e.g. one per sweep (null: none)
    tags: list[str] = field(default_factory=list)  # wandb tags

    def problems(self) -> list[str]:
        problems = []
        if self.backend not in LOGGER_BACKENDS:
            problems.append(f"logger.backend={self.backend!r} must be one of {LOGGER_BACKENDS}")
        project = self.project
        if self.backend == "wandb" and (
            not isinstance(project, str)
            or not 0 < len(project) <= 128
            or any(char in WANDB_PROJECT_FORBIDDEN for char in project)
        ):
            problems.append(
                f"logger.project={project!r} is not a wandb project name: 1 to 128 characters, "
                f"none of {' '.join(WANDB_PROJECT_FORBIDDEN)} (e.g. logger.project=cbop-torchrl)"
            )
        if self.mode not in WANDB_MODES:
            problems.append(f"logger.mode={self.mode!r} must be one of {', '.join(WANDB_MODES)}")
        return problems


@dataclass
class RunConfig(Section):
    """Everything one run needs; built from the Hydra tree by :func:`load_config`."""

    env: str = "demo"
    preset: str = "cpu"
    seed: int = 0  # the run's seed: networks, batches, rollouts, evaluation episodes
    device: str = "auto"
    threads: int | None = None  # torch CPU threads; None: torch's default (all cores)
    # torch.compile of the CBOP target: inductor on a CPU and inside a captured CUDA step;
    # on CUDA with cuda_graph=false, CUDA graphs for its Q-ensemble
    compile: bool = False
    # the whole CBOP gradient step as one captured CUDA graph: null (auto) on a CUDA device,
    # true requires one, false never (trainers/update.py)
    cuda_graph: bool | None = None
    resume: str = "auto"
    progress: bool = True
    agent: AgentConfig = field(default_factory=AgentConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    dynamics: DynamicsConfig = field(default_factory=DynamicsConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    fqe: FQEConfig = field(default_factory=FQEConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    RANGES = (positive("threads", "torch CPU threads, or null for torch's default", integer=True),)

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
        values["bc"] = self.bc.cache_fields()
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

    def range_problems(self) -> list[str]:
        """Every setting outside its range: the top level's and each section's own table."""
        values = self.to_dict()
        top = {key: value for key, value in values.items() if key not in SECTION_RANGES}
        problems = check_ranges(top, prefixed(self.RANGES))
        for name, table in SECTION_RANGES.items():
            problems += check_ranges(values[name], prefixed(table, f"{name}."), f"{name}.")
        return problems

    def problems(self) -> list[str]:
        """The top level's settings: resume, the device, CUDA graphs."""
        problems = []
        if str(self.resume).lower() not in RESUME_CHOICES:
            problems.append(f"resume={self.resume!r} must be one of {', '.join(RESUME_CHOICES)}")
        device = self.device
        if device not in DEVICE_CHOICES and not str(device).startswith("cuda:"):
            problems.append(f"device={device!r} must be auto, cpu, cuda or cuda:<index>")
        elif str(device).startswith("cuda") and not torch.cuda.is_available():
            problems.append(
                f"device={device} was requested but torch sees no CUDA device "
                "(torch.cuda.is_available() is False); use device=auto (CUDA when present, else "
                "the CPU) or device=cpu"
            )
        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        if self.cuda_graph and on_cpu:
            problems.append(
                "cuda_graph=true captures the CBOP step as a CUDA graph, which needs device=cuda "
                "on a machine with a GPU; drop cuda_graph=true (the default, cuda_graph=null, "
                "captures whenever the device is CUDA)"
            )
        return problems


#: ``(section, key, value that turns it off)`` of opt-in settings added after the first
#: checkpoints were written (see :meth:`RunConfig.training_dict`).
LATER_OPT_INS: tuple[tuple[str, str, Any], ...] = (
    ("agent", "bc_weight", 0.0),
    ("agent", "critic_penalty", 0.0),
    ("agent", "critic_layer_norm", False),
    ("agent", "critic_prior_scale", 0.0),
    ("estimator", "unbiased_variance", False),
    ("fqe", "drop_terminal", False),
)


SECTIONS: dict[str, type] = {
    "agent": AgentConfig,
    "estimator": EstimatorConfig,
    "dynamics": DynamicsConfig,
    "bc": BCConfig,
    "fqe": FQEConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "logger": LoggerConfig,
    "task": TaskConfig,
}
"""The run config's sections by key, in its order."""

TASK_RANGES = (positive("max_episode_steps", "or null for the family's cap", integer=True),)
"""The ranges of the task section (:class:`~cbop_torchrl.envs.task.TaskConfig`), which every
program has."""

SECTION_RANGES: dict[str, tuple[Range, ...]] = {
    name: TASK_RANGES if kind is TaskConfig else kind.RANGES for name, kind in SECTIONS.items()
}
"""Each section's table of ranges, by the section's key in the run config."""
