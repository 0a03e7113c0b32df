"""Which checkpoints of a behaviour-policy SAC run are D4RL's medium and expert policies.

Expert: the best evaluation return. Medium: the evaluation return nearest a fraction of a
reference (the run's best return, or D4RL's expert score), optionally among the
checkpoints that reach a normalized-score floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cbop_torchrl.registry import Task

MEDIUM_REFERENCES = ("best", "d4rl")


def medium_target(
    evaluations: Sequence[dict[str, Any]],
    medium_fraction: float,
    medium_reference: str = "best",
    family: Task | None = None,
) -> float:
    """The return a medium policy aims at: ``medium_fraction`` of the reference.

    The reference is the run's best evaluation return (``"best"``) or D4RL's
    expert score ``family.ref_max_score`` (``"d4rl"``, D4RL's own definition
    of medium: hopper 1/3 * 3234.3 = 1078.1).
    """
    if medium_reference == "d4rl":
        if family is None or not family.has_reference_scores:
            raise ValueError(
                "medium_reference=d4rl needs the task's expert score (task.ref_max_score, "
                "with task.ref_min_score); pass them, or use medium_reference=best "
                "medium_min_normalized=null stop_at_medium=false"
            )
        return medium_fraction * family.ref_max_score
    if not evaluations:
        raise ValueError("the SAC run has no evaluated checkpoint")
    return medium_fraction * max(e["return"] for e in evaluations)


def medium_reached(
    evaluation: dict[str, Any],
    target: float,
    family: Task,
    min_normalized: float | None = None,
) -> bool:
    """Whether a checkpoint's evaluation return reaches the medium ``target``
    and, if given, ``min_normalized`` (D4RL-normalized score, 0-100)."""
    if evaluation["return"] < target:
        return False
    return min_normalized is None or family.normalized_score(evaluation["return"]) >= min_normalized


def select_checkpoints(
    evaluations: Sequence[dict[str, Any]],
    medium_fraction: float,
    medium_reference: str = "best",
    family: Task | None = None,
    min_normalized: float | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The medium and the expert checkpoint of a run.

    Expert: the best evaluation return (earliest on ties). Medium: the
    evaluation return nearest :func:`medium_target` (earliest on ties) among
    the checkpoints whose evaluation scores at least ``min_normalized``
    (D4RL-normalized; None: every checkpoint). The evaluation is the
    checkpoint's mean deterministic return recorded by the run
    (``sac.eval_episodes`` episodes), so the floor holds for the recorded score.

    Raises:
        ValueError: no checkpoint reaches ``min_normalized`` (the run is too short).
    """
    if not evaluations:
        raise ValueError("the SAC run has no evaluated checkpoint")
    expert = max(evaluations, key=lambda e: (e["return"], -e["step"]))
    target = medium_target(evaluations, medium_fraction, medium_reference, family)
    candidates = list(evaluations)
    if min_normalized is not None:
        if family is None or not family.has_reference_scores:
            raise ValueError(
                f"medium_min_normalized={min_normalized} needs the task's reference scores "
                "(task.ref_min_score, task.ref_max_score); pass them or use "
                "medium_min_normalized=null"
            )
        candidates = [
            e for e in evaluations if family.normalized_score(e["return"]) >= min_normalized
        ]
        if not candidates:
            last = evaluations[-1]["step"]
            best = family.normalized_score(expert["return"])
            raise ValueError(
                f"no checkpoint of the SAC run scores medium_min_normalized={min_normalized}: "
                f"its best scores {best:.1f} normalized after {last} environment steps. "
                f"Train the same run longer (it continues where it stopped), e.g. "
                f"sac.total_steps={2 * last}, or lower medium_min_normalized."
            )
    medium = min(candidates, key=lambda e: (abs(e["return"] - target), e["step"]))
    return medium, expert
