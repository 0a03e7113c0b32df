"""The offline pipeline: dynamics -> BC -> FQE -> CBOP, then evaluation and ``results.json``.

:func:`run_pipeline` is the orchestrator. The first three stages are cached by data and
config (a second run reuses them); the CBOP stage (:mod:`cbop_torchrl.trainers.cbop_stage`)
runs on TorchRL's Trainer with the offline hooks
(:mod:`cbop_torchrl.trainers.offline_training`); the run's folder, resume state and
``results.json`` are an :class:`~cbop_torchrl.trainers.offline_run.OfflineRun`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensordict import TensorDictBase
from torchrl.trainers import TrainerHookBase

from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.data.transitions import warn_about_action_range
from cbop_torchrl.trainers.cbop_stage import (
    CBOPStage,
    build_cbop_loss,
    cbop_result_fields,
    cbop_stage,
    choose_rollout_dtype,
    critic_hidden_sizes,
    fqe_scheme,
    make_optimizer,
)
from cbop_torchrl.trainers.datasize import check_dataset_size, warn_about_terminals
from cbop_torchrl.trainers.decisions import (
    CBOP_SEED_OFFSET,
    RunDecisions,
    StageSeeds,
    seed_stage,
    uses_cuda_graph,
)
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics
from cbop_torchrl.trainers.offline_run import OfflineRun, StageClock, common_results, write_results
from cbop_torchrl.trainers.offline_training import (
    CBOP_KEYS,
    OfflineTraining,
    build_offline_training,
    final_evaluation,
    restore_final_records,
)
from cbop_torchrl.trainers.pretrain import load_or_train_bc, load_or_train_fqe


def run_pipeline(
    config: RunConfig,
    info: DatasetInfo,
    data: TensorDictBase,
    run_dir: Path,
    take_turns: TrainerHookBase | None = None,
) -> dict:
    """Runs CBOP as in appendix B of the paper and returns the ``results.json`` dict.

    Learn the dynamics ensemble, pretrain the actor by behaviour cloning and the
    Q-ensemble by fitted Q evaluation of the behaviour policy, train CBOP from
    them, evaluate. Each stage is one function below.

    Args:
        config: a config from :func:`cbop_torchrl.config.load_config`.
        info: the dataset's :class:`DatasetInfo`.
        data: the dataset TensorDict (any device; moved to the run's device).
        run_dir: where the checkpoint, the policy, the logs and ``results.json`` go.
            A checkpoint already there is resumed (``resume=auto|true``).
        take_turns: runs side by side (:mod:`cbop_torchrl.trainers.side_by_side`): the
            hook that hands over to the next run after each CBOP gradient step.

    Raises:
        DatasetError: the data is smaller than a batch or the model's holdout split.
        CheckpointError: ``resume=true`` without a checkpoint, a checkpoint
            written with other training settings, or a budget
            (``train.epochs * train.steps_per_epoch``) that ends before the
            checkpoint's step. A larger budget continues the run.
        NonFiniteLossError: a stage produced NaN/inf.
    """
    check_dataset_size(
        data,
        info.name,
        {"bc.batch_size": config.bc.batch_size, "train.batch_size": config.train.batch_size},
        fqe_batch=("fqe.batch_size", config.fqe.batch_size),
        dynamics=config.dynamics,
    )
    # decides device, capture and seeds once (cuda_graph=true off CUDA: refused here)
    run = OfflineRun.open(config, info, run_dir, config.training_dict())
    if (finished := run.finished_results()) is not None:
        return finished
    warn_about_terminals(data, info.name, run.task)
    run.start(config.to_dict())
    data = run.specs.to_agent_actions(data.to(run.device))
    warn_about_action_range(data, info.name)
    seed_stage(run.decisions.seeds.run)
    dynamics, dynamics_metrics = dynamics_stage(run, data)
    bc_state, bc_cached = behaviour_cloning_stage(run, data)
    fqe_state, fqe_cached = fitted_q_evaluation_stage(run, data)
    cbop = cbop_stage(run, data, dynamics, bc_state, fqe_state, take_turns)
    final = final_evaluation(run, cbop.training)
    if cbop.diagnostics is not None:
        cbop.diagnostics.measure(config.train.total_steps)
        cbop.diagnostics.close()
    pretraining = {
        "dynamics_cached": bool(dynamics_metrics.get("cached")),
        "dynamics_holdout_r2_mean": dynamics_metrics.get("holdout_r2_mean"),
        "bc_cached": bc_cached,
        "fqe_cached": fqe_cached,
    }
    return write_cbop_results(run, cbop, final, pretraining)


def dynamics_stage(run: OfflineRun, data: TensorDictBase) -> tuple[Any, dict[str, Any]]:
    """The dynamics ensemble (cached by dataset and dynamics config) and its metrics."""
    run.clock.start("dynamics")
    dynamics, metrics = load_or_train_dynamics(
        data, run.info, run.config.dynamics, progress=run.config.progress,
        log_fn=run.log_dynamics_epoch, termination=run.task.termination,
        cuda_graph=run.decisions.cuda_graph,
    )  # fmt: skip
    return dynamics.to(run.device), metrics


def behaviour_cloning_stage(run: OfflineRun, data: TensorDictBase) -> tuple[dict, bool]:
    """The BC actor's parameters (cached, resumable) and whether they came from the cache."""
    config, info = run.config, run.info
    run.clock.start("bc")
    seeds = run.decisions.seeds
    return load_or_train_bc(
        data, info.fingerprint, info.obs_dim, info.action_dim, run.hidden_sizes,
        config.bc, seeds.run, config.progress, run.log,
        cuda_graph=run.decisions.cuda_graph, stage_seed=seeds.bc,
    )  # fmt: skip


def fitted_q_evaluation_stage(run: OfflineRun, data: TensorDictBase) -> tuple[dict, bool]:
    """The Q-ensemble's parameters after FQE of the behaviour policy (cached, resumable)."""
    config, info = run.config, run.info
    run.clock.start("fqe")
    seeds = run.decisions.seeds
    return load_or_train_fqe(
        data, info.fingerprint, info.obs_dim, info.action_dim, critic_hidden_sizes(config),
        config.agent.num_qvalue_nets, config.agent.gamma, config.fqe,
        seeds.run, config.progress, run.log, q_init=config.agent.q_init,
        layer_norm=config.agent.critic_layer_norm, prior_scale=config.agent.critic_prior_scale,
        cuda_graph=run.decisions.cuda_graph, stage_seed=seeds.fqe,
    )  # fmt: skip


def write_cbop_results(
    run: OfflineRun, cbop: CBOPStage, final: dict[str, Any], pretraining: dict[str, Any]
) -> dict[str, Any]:
    """Saves the policy and writes ``results.json``; returns its dict."""
    metadata = run.policy_metadata(run.config.train.total_steps)
    fields = cbop_result_fields(run, cbop, pretraining)
    return write_results(run, cbop.training, final, metadata, fields)


__all__ = [
    "CBOP_KEYS",
    "CBOP_SEED_OFFSET",
    "CBOPStage",
    "OfflineRun",
    "OfflineTraining",
    "RunDecisions",
    "StageClock",
    "StageSeeds",
    "behaviour_cloning_stage",
    "build_cbop_loss",
    "build_offline_training",
    "cbop_stage",
    "choose_rollout_dtype",
    "common_results",
    "critic_hidden_sizes",
    "dynamics_stage",
    "final_evaluation",
    "fitted_q_evaluation_stage",
    "fqe_scheme",
    "make_optimizer",
    "restore_final_records",
    "run_pipeline",
    "uses_cuda_graph",
    "write_cbop_results",
]
