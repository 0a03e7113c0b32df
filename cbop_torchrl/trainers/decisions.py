"""What a run decides once, when it opens: device, dtype, CUDA-graph capture, seeds, config.

:func:`decide_run` settles them into one frozen :class:`RunDecisions`, kept on the
:class:`~cbop_torchrl.trainers.offline_run.OfflineRun` (``run.decisions``); the stages read
it and decide nothing of this again. Each stage still seeds the process's random streams
at its start (which is what lets a stage resume or be reused from the cache by itself),
from the seed listed here and through one function, :func:`seed_stage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cbop_torchrl.config import ConfigError, RunConfig
from cbop_torchrl.runtime import resolve_device, seed_everything
from cbop_torchrl.trainers.checkpoint import training_config_hash

#: The offset of each stage's seed from the run's ``seed`` (:class:`StageSeeds`).
BC_SEED_OFFSET = 1
FQE_SEED_OFFSET = 2
CBOP_SEED_OFFSET = 3
BASELINE_SEED_OFFSET = 5


@dataclass(frozen=True)
class StageSeeds:
    """Every stage's seed, from the run's ``seed`` and the offsets above.

    Attributes:
        run: the run's seed; the pipeline seeds the process with it before the dynamics
            stage, and it is what the cached stages' keys and the prior networks name.
        dynamics: the dynamics ensemble's own seed (``dynamics.seed``; the presets set it
            to the run's).
        bc, fqe, cbop: the behaviour-cloning, FQE and CBOP stages' (global streams and
            replay-sampling generators).
        evaluation: the evaluation episodes' (environment seeds).
        baseline: a baseline run's (global streams and replay sampling).
    """

    run: int
    dynamics: int
    bc: int
    fqe: int
    cbop: int
    evaluation: int
    baseline: int

    @classmethod
    def of(cls, seed: int, dynamics_seed: int | None = None) -> StageSeeds:
        """The seeds of a run with ``seed`` (``dynamics_seed`` None: ``seed``)."""
        seed = int(seed)
        return cls(
            run=seed,
            dynamics=seed if dynamics_seed is None else int(dynamics_seed),
            bc=seed + BC_SEED_OFFSET,
            fqe=seed + FQE_SEED_OFFSET,
            cbop=seed + CBOP_SEED_OFFSET,
            evaluation=seed,
            baseline=seed + BASELINE_SEED_OFFSET,
        )

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def seed_stage(seed: int) -> int:
    """Seeds Python, NumPy and torch (all devices) at the start of a stage; returns ``seed``.

    The one place a run's stages seed the process
    (:func:`~cbop_torchrl.runtime.seed_everything`), with a seed of :class:`StageSeeds`.
    """
    seed_everything(int(seed))
    return int(seed)


def uses_cuda_graph(config: RunConfig, device: torch.device) -> bool:
    """Whether the CBOP step is captured as a CUDA graph (``cuda_graph``: null = on CUDA).

    With ``compile=true`` the captured step holds the CBOP target compiled by inductor
    (:attr:`~cbop_torchrl.accel.estimator.EstimatorFastPaths.whole_step_graph`).
    Called once per run, by :func:`decide_run`, and once per side-by-side job for its joint
    pretraining, by :func:`~cbop_torchrl.apps.api.train_side_by_side`.

    Raises:
        ConfigError: ``cuda_graph=true`` on a device that is not CUDA.
    """
    on_cuda = device.type == "cuda"
    if config.cuda_graph and not on_cuda:
        raise ConfigError(
            f"cuda_graph=true captures the CBOP step as a CUDA graph, but this run is on "
            f"{device}; run with device=cuda on a machine with a GPU, or drop cuda_graph=true "
            "(the default, cuda_graph=null, captures only on CUDA)."
        )
    return on_cuda if config.cuda_graph is None else bool(config.cuda_graph)


@dataclass(frozen=True)
class RunDecisions:
    """What one run decided when it opened; the stages read it and decide none of it again.

    Attributes:
        device: where the run trains (``device``: ``auto`` resolved).
        dtype: the networks' and the dataset's floating-point type. The CBOP target's
            rollout type is ``config.estimator.rollout_dtype``; ``auto`` is measured once
            the networks are loaded and stored in the checkpoint (``rollout_choice``).
        cuda_graph: whether the gradient steps (dynamics, BC, FQE, CBOP) are captured as
            CUDA graphs (:func:`uses_cuda_graph`; False for a run without a captured step).
        seeds: every stage's seed.
        config: the resolved run config.
        training_config: the settings that change what is trained (refused on resume when
            they differ; the budget aside).
        config_hash: the hash of ``training_config`` without the budget, stored in every
            checkpoint.
    """

    device: torch.device
    dtype: torch.dtype
    cuda_graph: bool
    seeds: StageSeeds
    config: RunConfig = field(repr=False)
    training_config: dict[str, Any] = field(repr=False, compare=False)
    config_hash: str = ""

    def record(self) -> dict[str, Any]:
        """The decisions as plain values, for the checkpoint (``decisions``)."""
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "cuda_graph": self.cuda_graph,
            "seeds": self.seeds.to_dict(),
            "config_hash": self.config_hash,
        }


def decide_run(
    config: RunConfig, training_config: dict[str, Any], *, captures_step: bool = True
) -> RunDecisions:
    """Settles a run's device, dtype, capture, seeds and config hash, once.

    Args:
        config: the resolved run config.
        training_config: the settings that change what is trained.
        captures_step: whether this run's program has a step to capture as a CUDA graph
            (the CBOP pipeline: yes; the baselines: no, and ``cuda_graph`` is ignored).

    Raises:
        ConfigError: ``cuda_graph=true`` on a device that is not CUDA (``captures_step``).
        RuntimeError: ``device`` names no device, or CUDA where there is none.
    """
    device = resolve_device(config.device)
    return RunDecisions(
        device=device,
        dtype=torch.float32,
        cuda_graph=uses_cuda_graph(config, device) if captures_step else False,
        seeds=StageSeeds.of(config.seed, getattr(config.dynamics, "seed", None)),
        config=config,
        training_config=training_config,
        config_hash=training_config_hash(training_config),
    )


__all__ = [
    "BASELINE_SEED_OFFSET",
    "BC_SEED_OFFSET",
    "CBOP_SEED_OFFSET",
    "FQE_SEED_OFFSET",
    "RunDecisions",
    "StageSeeds",
    "decide_run",
    "seed_stage",
    "uses_cuda_graph",
]
