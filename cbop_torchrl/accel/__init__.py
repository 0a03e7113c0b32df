"""Every fast path of CBOP in one package, off until :func:`accelerate` turns them on.

The eager classes (:class:`cbop_torchrl.objectives.CBOPValueEstimator`,
:class:`cbop_torchrl.objectives.CBOPLoss`) compute the paper's target and losses with the
networks as modules, in float32. The same quantities run faster here:

- :mod:`~cbop_torchrl.accel.fused_mlp`: the Q-ensemble of plain MLPs as one ``baddbmm``
  per layer over the stacked ``[M, ...]`` parameters (rollout and loss);
- :mod:`~cbop_torchrl.accel.plans`: a plain actor as its matmuls, the fused Q-ensemble in
  row blocks;
- :mod:`~cbop_torchrl.accel.rollout_dtype`: bf16 rollouts and their automatic choice;
- :mod:`~cbop_torchrl.accel.estimator` and :mod:`~cbop_torchrl.accel.loss`: the classes
  with those paths, ``torch.compile`` of the target or the Q-ensemble, the loss's cache of
  detached parameters;
- :mod:`~cbop_torchrl.accel.captured_step`: the gradient step captured as one CUDA graph.

One call turns them on: ``accelerate(loss, rollout_dtype="bfloat16", compile=True)``
(:func:`accelerate`, settings :class:`FastPaths`), or build the accelerated classes
directly: :class:`CBOPLoss` and :class:`CBOPValueEstimator` here take the eager
constructors' arguments plus :class:`FastPaths`'s keywords. ``cbop-train`` builds its loss
with them (``estimator.rollout_dtype``, ``compile``; ``cuda_graph`` captures the step).
"""

from cbop_torchrl.accel.captured_step import CapturedStep
from cbop_torchrl.accel.estimator import CBOPValueEstimator
from cbop_torchrl.accel.loss import CBOPLoss
from cbop_torchrl.accel.settings import FastPaths
from cbop_torchrl.accel.switch import accelerate

__all__ = ["CBOPLoss", "CBOPValueEstimator", "CapturedStep", "FastPaths", "accelerate"]
