"""Is a dataset big enough to train on, and do its terminal flags look right? Checked before
any stage, so a 1-row file is refused in seconds instead of crashing in the dynamics stage.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from tensordict import TensorDictBase

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.registry import Task, never_terminates
from cbop_torchrl.trainers.dynamics import DynamicsConfig


def min_dynamics_rows(config: DynamicsConfig) -> int:
    """The fewest usable rows for which :func:`~cbop_torchrl.trainers.dynamics.split_holdout`
    leaves a holdout of at least 1 row and at least 2 training rows."""
    rows = 3
    while min(int(rows * config.holdout_ratio), config.max_holdout) < 1:
        rows += 1
    return rows


def check_dataset_size(
    data: TensorDictBase,
    name: str,
    batches: Mapping[str, int],
    fqe_batch: tuple[str, int] | None = None,
    dynamics: DynamicsConfig | None = None,
) -> None:
    """Refuses a dataset smaller than one batch of a stage or one holdout split of the model.

    Args:
        data: the dataset TensorDict ``[N]`` (``load_dataset``'s keys).
        name: the dataset's name, for the message.
        batches: ``{"train.batch_size": 256, ...}``: stages sampling from all ``N`` rows.
        fqe_batch: ``("fqe.batch_size", 256)``: FQE samples only the rows with a next
            action (``next_action_mask``), so those must fill one batch.
        dynamics: the ensemble's config when a dynamics stage runs: its holdout split
            needs :func:`min_dynamics_rows` rows with ``dynamics_mask`` True.

    Raises:
        DatasetError: naming every size that does not fit.
    """
    rows = int(data.shape[0])
    problems = []
    too_big = {key: size for key, size in batches.items() if size > rows}
    if too_big:
        listed = ", ".join(f"{key}={size}" for key, size in too_big.items())
        problems.append(
            f"it has {rows} transition{'s' if rows != 1 else ''}, fewer than one batch ({listed})"
        )
    if fqe_batch is not None:
        usable = int(data.get("next_action_mask").sum())
        key, size = fqe_batch
        if usable < size:
            problems.append(
                f"fitted Q evaluation uses the {usable} rows with a next action in the data "
                f"(not a timeout or a cut episode end), fewer than one batch ({key}={size})"
            )
            # rows that do not chain, in a dataset of at least one batch (a smaller one is
            # simply too small: its last row always ends a cut episode)
            if not too_big and (broken := unchained_rows(data)) * 2 > rows:
                raise DatasetError(unchained_message(name, broken, rows))
    if dynamics is not None:
        usable = int(data.get("dynamics_mask").sum())
        needed = min_dynamics_rows(dynamics)
        if usable < needed:
            problems.append(
                f"the dynamics ensemble trains on the {usable} rows with a real next "
                f"observation (not a timeout or a cut episode end) and needs at least {needed} "
                f"for a holdout of {dynamics.holdout_ratio:.0%} (dynamics.holdout_ratio) and 2 "
                "training rows"
            )
    if problems:
        raise DatasetError(
            f"the dataset {name!r} is too small to train on: {'; '.join(problems)}. Use a "
            "larger dataset" + (" or smaller batch sizes" if too_big or fqe_batch else "") + "."
        )


def unchained_rows(data: TensorDictBase) -> int:
    """Rows that end their episode without a terminal flag: their next observation is not
    the next row's observation (timeouts and episodes cut short; nearly every row when the
    observations do not chain)."""
    truncated = data.get(("next", "truncated")).reshape(-1)
    terminated = data.get(("next", "terminated")).reshape(-1)
    return int((truncated & ~terminated).sum())


def unchained_message(name: str, broken: int, rows: int) -> str:
    """Why a dataset whose rows do not chain into episodes cannot be trained on."""
    return (
        f"the dataset {name!r} cannot be trained on: in {broken} of its {rows} rows the "
        "observation of the next row is not this row's next observation (they differ beyond "
        "float32 rounding, rtol 1e-5), so its rows do not chain into episodes and no row has a "
        "next action for fitted Q evaluation. This happens when observations or "
        "next_observations were stored with less precision than float32 (float16, or HDF5's "
        "lossy scaleoffset filter) or the rows were shuffled. Store observations and "
        "next_observations as float32 without a lossy filter, in episode order."
    )


def warn_about_terminals(data: TensorDictBase, name: str, task: Task) -> None:
    """Warns when every row is terminal, or none is although ``task`` episodes can terminate."""
    terminated = data.get(("next", "terminated")).reshape(-1)
    count = int(terminated.sum())
    if count == terminated.numel():
        warnings.warn(
            f"every row of the dataset {name!r} is terminal (terminals=1): each transition "
            "ends its episode, so no value is bootstrapped beyond one step. Check that the "
            "file's terminals are not its timeouts.",
            stacklevel=2,
        )
    elif count == 0 and task.termination_fn is not never_terminates:
        warnings.warn(
            f"no row of the dataset {name!r} is terminal, but {task.gym_id} episodes end when "
            f"the agent falls (task.termination={task.termination}): the file may have lost "
            "its terminal flags (stored as timeouts, or not at all).",
            stacklevel=2,
        )
