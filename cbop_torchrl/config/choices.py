"""Every setting's allowed values when it is a choice, written once.

The schemas (:mod:`cbop_torchrl.cli.schemas`) type a choice key with its enum, so
Hydra refuses anything else while it composes the config; the plain tuples below are what
the Python API's checks (:func:`cbop_torchrl.config.validate`, the estimator's
:class:`~cbop_torchrl.objectives.cbop_settings.CBOPSettings`) compare against. This module
imports nothing of the package, so every layer may name a choice from here.
"""

from __future__ import annotations

from enum import Enum


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


class MediumReference(Choice):
    best = "best"
    d4rl = "d4rl"


class RolloutExploration(Choice):
    random = "random"
    deterministic = "deterministic"


class Compression(Choice):
    gzip = "gzip"
    lzf = "lzf"


def choice_values(choice: type[Choice]) -> tuple[str, ...]:
    """The plain strings of a choice, in its order (``('lcb', 'map', 'fixed', 'quantile')``)."""
    return tuple(member.value for member in choice)


MODES = ESTIMATOR_MODES = choice_values(EstimatorMode)
FIXED_WEIGHTINGS = choice_values(FixedWeighting)
TERMINATIONS = choice_values(Termination)
SAMPLINGS = choice_values(Sampling)
ACTIVATIONS = choice_values(DynamicsActivation)
Q_INITS = choice_values(QInit)
EVAL_BACKENDS = choice_values(EvalBackend)
LOGGER_BACKENDS = choice_values(LoggerBackend)
WANDB_MODES = choice_values(WandbMode)
RESUME_CHOICES = ("auto", "true", "false")  # a str key: Hydra reads true/false as booleans
DEVICE_CHOICES = ("auto", "cpu", "cuda")  # and cuda:<index>
