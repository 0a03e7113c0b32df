"""Scores of a run's snapshots (``eval.snapshot_interval``) on the CPU, after training.

A run trained with snapshots and without evaluation (a GPU job) holds
``snapshots/step<k>.pt`` (:mod:`cbop_torchrl.trainers.snapshots`). :func:`score_run`
evaluates each one on the measures the CPU runs use, and keeps the records in
``<run dir>/snapshot_scores.json`` (a snapshot scored already is not scored again):

- the reset measure: ``eval.episodes`` deterministic episodes from ``env.reset()`` through
  the project's TorchRL collector (:class:`~cbop_torchrl.envs.PolicyEvaluator`, as the
  training's :class:`~cbop_torchrl.trainers.hooks.EvaluationHook`), the same keys as an
  ``eval_history`` record;
- the start-state measure: one episode from each of the snapshot's 100 dataset states
  restored in the simulator (``start_*``, as ``eval.start_states=100``);
- Q - MC at the same states (``conservatism``, the fields of
  :func:`~cbop_torchrl.trainers.conservatism.dataset_conservatism`): the critics' Q at the
  policy's actions, stored in the snapshot, against the discounted return of the same
  deterministic rollouts, with the soft critic's entropy part estimated along them.

One rollout from the restored states gives both the start-state returns (undiscounted) and
the Monte-Carlo returns (discounted); its actions are the deterministic policy's, so the
entropy samples drawn along it change neither.

:func:`seed_summary` makes a finished run's seed summary: the fields
``benchmarks/learning.py`` writes (:func:`~cbop_torchrl.evaluation.summaries.summarize_run`
and :func:`~cbop_torchrl.evaluation.analysis.score_measures`) with the snapshots' scores as
its evaluations, so ``rows.json``, the report and ``benchmarks/psi_grid.py`` read it as any
other.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.envs import PolicyEvaluator, make_eval_env, resolve_task, run_evaluator
from cbop_torchrl.envs.evaluate import EvalResult
from cbop_torchrl.envs.starts import START_STATES_SEED, rollout_restored
from cbop_torchrl.evaluation.analysis import score_measures
from cbop_torchrl.evaluation.summaries import final_window_score, summarize_run
from cbop_torchrl.io import atomic_json_dump, cache_dir, read_regular_text
from cbop_torchrl.trainers.checkpoint import (
    INTEGRITY_KEY,
    POLICY_NAME,
    load_checkpoint,
    load_policy,
    save_policy,
)
from cbop_torchrl.trainers.conservatism import conservatism_record, policy_entropy_fn
from cbop_torchrl.trainers.hooks import EVAL_SCALARS
from cbop_torchrl.trainers.snapshots import snapshot_path, snapshot_steps

SCORES_NAME = "snapshot_scores.json"
SCORES_FORMAT = "cbop-torchrl-snapshot-scores/1"
MOVED_NAME = "env_recorded.json"
"""Where :func:`localize_dataset` keeps the data path a run trained elsewhere recorded."""
PROVENANCE_KEYS = (
    "command", "data_key", "sha256", "transitions", "episodes", "episode_normalized_score_mean",
    "policy_normalized_score", "sac_total_steps",
)  # fmt: skip
"""What a seed summary keeps of the set file's provenance: benchmarks/set_files.py's keys."""


class ScoringError(ValueError):
    """A path that holds no run with snapshots, or a run whose dataset is not on this machine."""


def run_dataset(run_dir: Path, values: dict[str, Any]) -> str:
    """The run's dataset as this machine reads it: the recorded one, else the cache's file of
    that name (a run trained on another machine, whose cache was elsewhere).

    Raises:
        ScoringError: neither is here.
    """
    env = str(values.get("env"))
    if not env.endswith(".hdf5") or Path(env).is_file():
        return env
    here = cache_dir("generated") / Path(env).name
    if here.is_file():
        return str(here)
    raise ScoringError(
        f"the run {str(run_dir)!r} trained on {env}, which is not on this machine, and "
        f"{str(here)!r} does not exist either; put the set's file there (for a benchmark set: "
        f"python benchmarks/set_files.py {Path(env).stem}) and score again"
    )


def localize_dataset(run_dir: Path) -> None:
    """Points the run's ``config.json`` at this machine's copy of its dataset, when the
    recorded file is not here and the cache's file of that name has the content the run
    recorded (``data.json``); the recorded path is kept in ``env_recorded.json``. Then FQE
    selection (``benchmarks/psi_grid.py --select``) and the report read the run here.

    Raises:
        ScoringError: the file is not here, or the cache's file holds other data.
    """
    path = Path(run_dir) / "config.json"
    values = json.loads(read_regular_text(path))
    here = run_dataset(Path(run_dir), values)
    if here == str(values.get("env")):
        return
    data_json = Path(run_dir) / "data.json"
    recorded = (
        json.loads(read_regular_text(data_json)).get("content") if data_json.is_file() else None
    )
    if recorded is not None and file_sha256(Path(here)) != recorded:
        raise ScoringError(
            f"the run {str(run_dir)!r} trained on a file of sha256 {recorded[:12]}..., and "
            f"{here!r} holds other data; put the run's own file there and score again"
        )
    # The recorded path is kept beside, not in config.json: every reader of a config refuses
    # keys of no setting.
    atomic_json_dump({"env": values.get("env"), "now": here}, Path(run_dir) / MOVED_NAME)
    atomic_json_dump({**values, "env": here}, path)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def final_policy(run_dir: Path, step: int) -> Path:
    """The finished run's ``policy.pt``, checked to be the last snapshot's actor (written from
    it when the run's files came without it), so FQE selection scores that actor.

    Raises:
        ScoringError: ``policy.pt`` holds another actor.
    """
    policy, snapshot = Path(run_dir) / POLICY_NAME, snapshot_path(run_dir, step)
    last = load_checkpoint(snapshot)["actor"]
    if policy.is_file():
        stored = load_checkpoint(policy)["actor"]
        if stored.keys() != last.keys() or any(not torch.equal(stored[k], last[k]) for k in last):
            raise ScoringError(
                f"{str(policy)!r} is not the actor of the last snapshot {str(snapshot)!r}; the "
                "run's files were mixed with another run's. Score a run directory as training "
                "left it"
            )
        return policy
    actor, _, metadata = load_policy(snapshot)
    return save_policy(policy, actor, metadata)


def load_scoring_config(run_dir: Path) -> tuple[RunConfig, Any, Any]:
    """The run's :class:`RunConfig` (its ``config.json``), its dataset and its info."""
    values = json.loads(read_regular_text(Path(run_dir) / "config.json"))
    values.pop("algo", None)
    values["env"] = run_dataset(Path(run_dir), values)
    loaded: dict[str, Any] = {}

    def lookup(env: str) -> tuple[Any, str]:
        loaded["data"], loaded["info"] = load_dataset_with_info(env)
        return loaded["info"].family, loaded["info"].name

    config, _ = load_config(values, lookup)
    return config, loaded["data"], loaded["info"]


def score_snapshot(path: Path, config: RunConfig, task: Any, env: Any) -> dict[str, Any]:
    """One snapshot's ``eval_history``-style record: reset and start-state scores, Q - MC.

    Args:
        path: ``snapshots/step<k>.pt``.
        config: the run's config (``eval.max_steps``, ``seed``, ``agent.gamma``).
        task: the real environment and its reference scores.
        env: the reset measure's batched environments (``eval.episodes`` of them).
    """
    snapshot = load_checkpoint(path)
    actor, _, _ = load_policy(path)
    actor.eval()
    record: dict[str, Any] = {"step": int(snapshot["step"])}
    evaluator = PolicyEvaluator(env, actor, config.eval.max_steps)
    try:
        summary = run_evaluator(evaluator, task, config.seed).summary()
    finally:
        evaluator.close()
    for key in EVAL_SCALARS:
        record[key] = summary[key]
    critic, obs = snapshot["critic"], snapshot["states"]["observation"].float()
    alpha, gamma = float(critic["alpha"]), float(config.agent.gamma)
    generator = torch.Generator().manual_seed(config.seed)
    entropy_fn = policy_entropy_fn(actor, generator) if alpha > 0 else None
    with torch.no_grad():
        rollout = rollout_restored(
            actor, task, obs, gamma, config.eval.max_steps, entropy_fn=entropy_fn
        )
    returns = [float(r) for r in rollout.returns]
    if not all(math.isfinite(r) for r in returns):
        raise FloatingPointError(f"{path}: the start-state episodes gave non-finite returns")
    starts = EvalResult(
        returns=returns,
        normalized_scores=[task.normalized_score(r) for r in returns]
        if task.has_reference_scores
        else None,
        lengths=[int(n) for n in rollout.lengths],
    ).summary()
    for key in EVAL_SCALARS:
        record[f"start_{key}"] = starts[key]
    record["conservatism"] = conservatism_record(
        critic["q_policy"].float(), rollout.discounted.float(), rollout.lengths,
        rollout.entropy.float(), gamma, alpha,
    )  # fmt: skip
    record["snapshot_digest"] = snapshot.get(INTEGRITY_KEY)
    return record


def stored_scores(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The records of ``snapshot_scores.json`` by step ({} when there is none)."""
    path = Path(run_dir) / SCORES_NAME
    if not path.is_file():
        return {}
    stored = json.loads(read_regular_text(path))
    return {int(r["step"]): r for r in stored.get("records", [])}


def score_run(run_dir: Path, announce: Any = None) -> list[dict[str, Any]]:
    """Scores every snapshot of ``run_dir`` not scored yet; returns all records by step.

    A snapshot is scored again only when its file changed (its digest). The records file is
    rewritten after each snapshot, so an interrupted scoring keeps what it did.
    """
    run_dir = Path(run_dir)
    records = stored_scores(run_dir)
    steps = snapshot_steps(run_dir)
    todo = []
    for step in steps:
        digest = load_checkpoint(snapshot_path(run_dir, step)).get(INTEGRITY_KEY)
        if step not in records or records[step].get("snapshot_digest") != digest:
            todo.append(step)
    if todo:
        localize_dataset(run_dir)
        config, _, info = load_scoring_config(run_dir)
        task = resolve_task(config.task, info)
        env = make_eval_env(task, config.eval.episodes, config.eval.backend)
        try:
            for step in todo:
                if announce is not None:
                    announce(run_dir, step)
                records[step] = score_snapshot(snapshot_path(run_dir, step), config, task, env)
                kept = [records[s] for s in sorted(records) if s in steps]
                atomic_json_dump({"format": SCORES_FORMAT, "records": kept}, run_dir / SCORES_NAME)
        finally:
            env.close()
    return [records[s] for s in steps]


def dataset_provenance(run_dir: Path, config_values: dict[str, Any]) -> dict[str, Any]:
    """The set file's provenance (:data:`PROVENANCE_KEYS`; the generator's record beside the
    file), else the sha256 the run recorded of its data (``data.json``)."""
    try:
        data = Path(run_dataset(run_dir, config_values))
    except ScoringError:
        data = Path(str(config_values.get("env")))
    record = data.with_suffix(".provenance.json")
    if record.is_file():
        values = json.loads(read_regular_text(record))
        return {key: values.get(key) for key in PROVENANCE_KEYS}
    data_json = Path(run_dir) / "data.json"
    if data_json.is_file():
        return {"sha256": json.loads(read_regular_text(data_json)).get("content")}
    return {}


def package_commit() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


def seed_summary(run_dir: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A finished run's seed summary, its evaluations the snapshots' (module doc).

    ``variant`` is ``cbop-<preset>-psi<psi>``; ``scored_from`` says the scores are the
    snapshots'. The run's own end-of-run evaluation (``last_normalized_score`` of its
    ``results.json``) is replaced by the last snapshot's.
    """
    run_dir = Path(run_dir)
    localize_dataset(run_dir)
    summary = summarize_run(run_dir, analysis=False)
    values = json.loads(read_regular_text(run_dir / "config.json"))
    curve = [[r["step"], r["normalized_score_mean"]] for r in records]
    last = records[-1]
    best_step, best = max(((s, v) for s, v in curve), key=lambda item: item[1])
    interval = int(values["eval"]["snapshot_interval"])
    psi = summary["diagnostics"]["settings"]["psi"]
    summary.update(
        variant=f"cbop-{values.get('preset')}-psi{float(psi):g}",
        final_normalized_score=final_window_score(curve, last["normalized_score_mean"]),
        last_normalized_score=last["normalized_score_mean"],
        final_normalized_score_std=last["normalized_score_std"],
        final_return=last["return_mean"],
        best_normalized_score=float(best),
        best_step=best_step,
        curve=curve,
        scored_from="snapshots",
        session_wall_s=summary.get("wall_time_s"),
    )
    summary.update(
        score_measures(
            records, interval=interval, episodes=int(values["eval"]["episodes"]), start_states=100
        )
    )
    summary["start_states"]["seed"] = START_STATES_SEED
    summary["analysis"] = {"conservatism": last["conservatism"]}
    summary["fqe_policy"] = (
        f"{final_policy(run_dir, last['step']).name}: the actor of snapshots/step{last['step']}.pt"
    )
    summary["command"] = f"cbop-score paths={run_dir}"
    summary["commit"] = package_commit()
    summary["dataset_provenance"] = dataset_provenance(run_dir, values)
    summary["finished_utc"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    summary["host"] = {"nproc": os.cpu_count(), "loadavg": os.getloadavg()}
    return summary


__all__ = [
    "PROVENANCE_KEYS",
    "SCORES_NAME",
    "ScoringError",
    "final_policy",
    "localize_dataset",
    "load_scoring_config",
    "score_run",
    "score_snapshot",
    "seed_summary",
    "stored_scores",
]
