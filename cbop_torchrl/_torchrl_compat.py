"""The one place that relies on TorchRL internals, each with the reason.

Checked against TorchRL ``TORCHRL_CHECKED`` (``tests/test_torchrl_compat.py``
checks every assumption below, the Minari conversion in
``tests/test_data_sources.py``, so a TorchRL upgrade that breaks one fails there
first, with the name of what changed).

- :class:`SACTargetFromEstimator` overrides ``SACLoss._compute_target_v2``.
  SACLoss (version 2) has no public hook for its critic target: before it asks
  its value estimator, ``_compute_target_v2`` samples ``a' ~ pi(.|s')`` and
  runs all M target Q-networks on it to write ``("next", "state_value")``.
  CBOP's estimator makes its own bootstrap from model rollouts, so that work
  would be thrown away every step.

- :func:`convert_minari_dataset` overrides
  ``MinariExperienceReplay._download_and_preproc`` and, while it runs,
  ``TensorDict.memmap_like``: TorchRL's conversion fills an in-memory
  TensorDict with the episodes and writes it with ``memmap_like``, which
  stores a contentless (all-zero) copy. ``memmap_like`` is a class attribute
  every TensorDict in a process shares, so the conversion runs in a child
  process started for it (``python -m cbop_torchrl._torchrl_compat``): the
  caller's process never sees a replaced ``TensorDict.memmap_like``.

Everything else the package once took from TorchRL's private API now has a
public replacement here or where it is used: :func:`vmap_over_params`
(instead of ``torchrl.objectives.utils._vmap_func``), ``loss.log_alpha``
(instead of ``SACLoss._alpha``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

#: The TorchRL version the internals used here were checked against.
TORCHRL_CHECKED = "0.14.1"


class SACTargetFromEstimator:
    """Mixin for a TorchRL ``SACLoss`` (v2) subclass: the critic target is the value estimator's.

    ``class MyLoss(SACTargetFromEstimator, SACLoss)`` regresses the Q-ensemble on
    ``loss.value_estimator.value_estimate(batch)`` ``[*batch]`` alone; SACLoss's
    own bootstrap from ``s'`` (one actor pass and M target-Q passes) is skipped.
    """

    def _compute_target_v2(self, tensordict: TensorDictBase) -> torch.Tensor:
        return self.value_estimator.value_estimate(tensordict).squeeze(-1)


def vmap_over_params(
    module: torch.nn.Module,
    in_dims: tuple[Any, ...] = (None, 0),
    randomness: str = "error",
    loop: bool = False,
) -> Callable[[TensorDictBase, TensorDictBase], TensorDictBase]:
    """``f(tensordict, params)``: ``module`` run with every slice of stacked ``params``.

    ``params`` holds ``[M, ...]`` parameters of ``module`` (e.g.
    ``TensorDict.from_modules(*nets, as_module=True)``); ``in_dims`` says which
    arguments carry the member dim (``(None, 0)``: a shared input; ``(0, 0)``:
    one input slice per member). The output TensorDict has a leading ``M``.
    Built on ``torch.vmap`` and ``TensorDictBase.to_module`` (public APIs);
    ``loop=True`` runs the members one after another (debugging).
    """

    def call(tensordict: TensorDictBase, params: TensorDictBase) -> TensorDictBase:
        with params.to_module(module, preserve_module_state=False):
            return module(tensordict)

    if not loop:
        return torch.vmap(call, in_dims, randomness=randomness)

    def looped(tensordict: TensorDictBase, params: TensorDictBase) -> TensorDictBase:
        members = params.batch_size[0]
        outs = [
            # A shallow copy per member: the module writes its output into its input.
            call(tensordict.clone(False) if in_dims[0] is None else tensordict[m], params[m])
            for m in range(members)
        ]
        return torch.stack(outs)

    return looped


def convert_minari_dataset(dataset_id: str, root: str | Path) -> Path:
    """Writes TorchRL's converted copy of a locally stored Minari dataset, with its data.

    ``MinariExperienceReplay(dataset_id, root=root, download=False)`` reads the
    copy afterwards. The dataset must be in Minari's local store
    (``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets``). The conversion runs
    in a child process (see the module docstring) and into a temporary
    directory that is moved into place when complete, so an interrupted
    conversion leaves no half-written copy behind.

    Returns:
        ``root / dataset_id``, TorchRL's copy.

    Raises:
        RuntimeError: the conversion failed; the message ends with the child's error.
    """
    root = Path(root)
    target = root / dataset_id
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".converting-") as scratch:
        done = subprocess.run(
            [sys.executable, "-m", "cbop_torchrl._torchrl_compat", dataset_id, scratch],
            capture_output=True, text=True, env={**os.environ, "RL_WARNINGS": "False"},
        )  # fmt: skip
        if done.returncode != 0:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            raise RuntimeError(lines[-1] if lines else f"exit code {done.returncode}")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # converted meanwhile by another process
            shutil.rmtree(target)
        os.replace(Path(scratch) / dataset_id, target)
    return target


def _convert_minari_here(dataset_id: str, root: str) -> None:
    """The child process's part of :func:`convert_minari_dataset` (replaces ``memmap_like``)."""
    from torchrl.data.datasets import MinariExperienceReplay

    class MinariKeepingData(MinariExperienceReplay):
        def _download_and_preproc(self):
            def memmap_with_contents(data, prefix=None, *args, **kwargs):
                return data.memmap(prefix)

            TensorDict.memmap_like = memmap_with_contents  # this process only
            return super()._download_and_preproc()

    MinariKeepingData(
        dataset_id, batch_size=1, root=root, download=True, load_from_local_minari=True
    )


if __name__ == "__main__":
    _convert_minari_here(*sys.argv[1:3])
