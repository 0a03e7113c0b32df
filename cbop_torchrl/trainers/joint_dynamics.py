"""Several seeds' dynamics ensembles trained together, each as it is trained alone.

:func:`train_dynamics_together` takes R configs that differ only in ``seed`` and trains the
R ensembles of ``E`` members as one ensemble of ``R * E`` members: seed ``r``'s members are
the member block ``[r * E, (r + 1) * E)``, every layer of every member one ``baddbmm`` over
the ``R * E`` member dimension (:class:`~cbop_torchrl.modules.ensemble.EnsembleLinear`), and
one fused Adam steps them all.

Why stack on the member axis rather than ``vmap`` over a seed axis: the ensemble is already
a batch of independent members (every parameter has the member dimension first, the loss is
a sum over members, Adam is elementwise), so a seed axis is just more members, and the
training step is :func:`~cbop_torchrl.trainers.dynamics.minibatch_step` itself, with its
CUDA-graph capture, on the module the rest of the package uses. ``vmap`` would run the same
batched matmuls through functorch's batching rules and need a functional copy of the
step, of the optimizer and of the capture. The authors' ``dynamics.shared_logvar_bounds``
(one bound pair shared by a seed's members) becomes one pair per seed
(:class:`~cbop_torchrl.modules.dynamics.GaussianEnsemble`'s ``bound_groups``), repeated
over that seed's members.

What each seed keeps of its own, drawn exactly as :func:`~cbop_torchrl.trainers.dynamics.
train_dynamics` draws it from its ``config.seed`` (:func:`~cbop_torchrl.trainers.dynamics.
prepare_fit`, the same function): its initialisation, holdout split, normalizer,
bootstrap resample and the per-epoch order of its members' rows (its own shuffle
generator, one draw per epoch as alone). Seed ``r``'s standardized training rows are the
row block ``r`` of one ``[R * N, O + A]`` tensor, and its members' minibatch indices are
offset into it, so every member sees the rows, in the order, it sees alone. No draw
differs. After each epoch every seed's members are copied back into its own ensemble and
its holdout MSE, snapshots and patience (:class:`~cbop_torchrl.trainers.dynamics.
EarlyStopping`) are its own; a seed that stops takes its snapshots, selects its elites and
is handed to ``on_trained`` (which caches it) at once, and the joint ensemble and Adam
state are cut down to the seeds still training. Each member's arithmetic is the same as
alone; only the kernels differ (a batched matmul over more members, a fused Adam over
longer tensors; with shared bounds the bounds' gradient is summed over a seed's members in
another order), so a seed's model equals the model alone to float rounding
(``tests/test_pretrain_together.py``; at the debug preset's sizes on the CPU, without
shared bounds, it has been bit for bit equal). A step rounded differently is then grown by
training as any rounding difference is (a one-ulp change of one initial weight of a seed
alone moves its weights as much), so over many epochs the weights drift apart while the
elites and the holdout fit agree.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tqdm.auto import tqdm

from cbop_torchrl.accel import CapturedStep
from cbop_torchrl.config import DynamicsConfig
from cbop_torchrl.modules.dynamics import DynamicsModel
from cbop_torchrl.trainers.dynamics import (
    DynamicsFit,
    EarlyStopping,
    _build_ensemble,
    epoch_indices,
    finish_fit,
    holdout_losses,
    minibatch_step,
    prepare_fit,
)
from cbop_torchrl.trainers.dynamics_quality import dynamics_rows

OnTrained = Callable[[int, DynamicsModel, dict[str, Any]], None]
LogFn = Callable[[dict[str, Any]], None]


def without_seed(config: DynamicsConfig) -> dict[str, Any]:
    """``config``'s settings but its seed: configs with equal ones train together."""
    values = config.to_dict()
    values.pop("seed")
    return values


def joinable(configs: Sequence[DynamicsConfig]) -> bool:
    """Whether ``configs`` can train as one ensemble: equal but for ``seed``, seeds distinct."""
    first = without_seed(configs[0])
    return all(without_seed(config) == first for config in configs) and len(
        {config.seed for config in configs}
    ) == len(configs)


class _Joint:
    """The active seeds' members as one ensemble of ``len(active) * E``, its Adam and step.

    Args:
        fits: every seed's fit (its ensemble holds its current parameters).
        active: the indices into ``fits`` of the seeds still training, in block order.
        data: ``(train_x, train_y)``, every seed's standardized training rows, seed ``i``'s
            the row block ``i`` (``[R * N, O + A]``, ``[R * N, O + 1]``).
        cuda_graph: capture the joint minibatch step as a CUDA graph.
        optimizer_state: the Adam state of the previous joint ensemble, already cut to
            ``active``'s member blocks (None: a fresh Adam).
    """

    def __init__(
        self,
        fits: Sequence[DynamicsFit],
        active: Sequence[int],
        data: tuple[torch.Tensor, torch.Tensor],
        cuda_graph: bool,
        optimizer_state: dict[str, Any] | None = None,
    ) -> None:
        config = fits[0].config
        self.active = list(active)
        self.members = config.num_members
        template = fits[active[0]].ensemble
        joint_config = dataclasses.replace(config, num_members=len(active) * self.members)
        with torch.random.fork_rng(devices=[]):  # its own initialisation is overwritten
            ensemble = _build_ensemble(
                joint_config, template.obs_dim, template.action_dim, bound_groups=len(active)
            )
        self.ensemble = ensemble.to(template.input_mean.device)
        with torch.no_grad():
            for name, param in self.ensemble.named_parameters():
                parts = [fits[i].ensemble.get_parameter(name) for i in active]
                param.copy_(torch.cat(parts))
        self.optimizer = torch.optim.Adam(
            self.ensemble.param_groups(config.weight_decay), lr=config.lr, fused=True,
            capturable=cuda_graph,
        )  # fmt: skip
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.step = minibatch_step(self.ensemble, self.optimizer, *data, config)
        self.captured = CapturedStep(self.step) if cuda_graph else None

    def block(self, position: int, rows: int | None = None) -> slice:
        """The seed at ``position`` in :attr:`active`'s rows of a joint tensor whose first
        dimension holds ``rows`` per seed (its members, or 1: a shared bound pair)."""
        rows = self.members if rows is None else rows
        return slice(position * rows, (position + 1) * rows)

    @torch.no_grad()
    def copy_out(self, fits: Sequence[DynamicsFit]) -> None:
        """Every active seed's members (and bounds) into its own ensemble."""
        for position, index in enumerate(self.active):
            for name, param in fits[index].ensemble.named_parameters():
                joint = self.ensemble.get_parameter(name)
                param.copy_(joint[self.block(position, joint.shape[0] // len(self.active))])

    def optimizer_state_for(self, keep: Sequence[int]) -> dict[str, Any]:
        """The Adam state of the seeds ``keep`` (indices into ``fits``, a subsequence of
        :attr:`active`), for the joint ensemble of those seeds."""
        seeds = len(self.active)

        def cut(value: torch.Tensor) -> torch.Tensor:
            if value.dim() == 0 or value.shape[0] % seeds:
                return value  # Adam's step count
            per_seed = value.shape[0] // seeds
            rows = torch.cat(
                [torch.arange(per_seed) + self.active.index(i) * per_seed for i in keep]
            )
            return value.index_select(0, rows.to(value.device))

        state = self.optimizer.state_dict()
        kept = {
            key: {name: cut(value) for name, value in values.items()}
            for key, values in state["state"].items()
        }
        return {"state": kept, "param_groups": state["param_groups"]}


def _joint_epoch(joint: _Joint, fits: Sequence[DynamicsFit]) -> torch.Tensor:
    """One epoch of every active seed, as :func:`~cbop_torchrl.trainers.dynamics.train_epoch`
    runs it alone; returns each member's mean NLL over the minibatches, ``[len(active) * E]``.
    """
    config = fits[0].config
    num_train = fits[0].num_train
    epoch_idx = torch.cat(
        [
            epoch_indices(fits[i].bootstrap, fits[i].shuffle_gen, config) + i * num_train
            for i in joint.active
        ]
    )  # [R' * E, N]: seed i's rows are the block i of the joint data
    nll_sum = torch.zeros(epoch_idx.shape[0], device=epoch_idx.device)
    batches = epoch_idx.split(config.batch_size, dim=1)
    for batch_idx in batches:
        full = batch_idx.shape[1] == config.batch_size
        run = joint.captured if joint.captured is not None and full else joint.step
        nll_sum += run(TensorDict({"index": batch_idx}, batch_size=[])).get("member_nll")
    return nll_sum / len(batches)


def train_dynamics_together(
    dataset_td: TensorDictBase,
    termination: str,
    configs: Sequence[DynamicsConfig],
    progress: bool = True,
    on_trained: OnTrained | None = None,
    log_fns: Sequence[LogFn | None] | None = None,
    cuda_graph: bool = False,
) -> list[tuple[DynamicsModel, dict[str, Any]]]:
    """Trains one ensemble per config in ``configs`` (:func:`joinable`) together; each is
    the model :func:`~cbop_torchrl.trainers.dynamics.train_dynamics` trains from it alone.

    Args:
        dataset_td: dataset TensorDict ``[N]`` (its device is the training's).
        termination: the models' termination function name.
        configs: R dynamics configs equal but for their seeds.
        progress: a tqdm bar over the joint epochs.
        on_trained: called with ``(index into configs, model, metrics)`` as soon as a seed
            has stopped (its early stopping is its own), e.g. to cache it.
        log_fns: one per config (or None): each seed's epoch records, as ``train_dynamics``'s
            ``log_fn`` gets them.
        cuda_graph: capture the joint minibatch step as a CUDA graph.

    Returns:
        ``(model, metrics)`` per config, in order; ``metrics`` as ``train_dynamics``'s
        (``wall_time_s``: from the joint start to the seed's stop).
    """
    if not joinable(configs):
        raise ValueError(
            "train_dynamics_together trains configs that differ only in their (distinct) "
            "seeds and have shared_logvar_bounds off; train the others with train_dynamics"
        )
    start_time = time.perf_counter()
    rows = dynamics_rows(dataset_td)
    fits = [prepare_fit(rows, config) for config in configs]
    stops = [EarlyStopping(fit.ensemble, fit.config) for fit in fits]
    data = (torch.cat([fit.train_x for fit in fits]), torch.cat([fit.train_y for fit in fits]))
    joint = _Joint(fits, range(len(fits)), data, cuda_graph)
    results: list[tuple[DynamicsModel, dict[str, Any]] | None] = [None] * len(fits)
    bar = tqdm(total=configs[0].max_epochs, desc=f"dynamics x{len(fits)}", unit="epoch",
               disable=not progress)  # fmt: skip
    while True:
        joint.ensemble.train()
        member_nll = _joint_epoch(joint, fits)
        joint.ensemble.eval()
        joint.copy_out(fits)
        finished = []
        for position, index in enumerate(joint.active):
            fit = fits[index]
            mse, nll = holdout_losses(fit.ensemble, fit.hold_x, fit.hold_y)
            train_nll = member_nll[joint.block(position)].mean()
            record = stops[index].after_epoch(fit.ensemble, mse, nll, train_nll)
            if log_fns is not None and log_fns[index] is not None:
                log_fns[index](record)
            if stops[index].done:
                finished.append(index)
        bar.update(1)
        bar.set_postfix(training=len(joint.active))
        for index in finished:
            stops[index].restore(fits[index].ensemble)
            results[index] = finish_fit(fits[index], termination, stops[index].epoch, start_time)
            if on_trained is not None:
                on_trained(index, *results[index])
        keep = [index for index in joint.active if index not in finished]
        if not keep:
            break
        if finished:
            joint = _Joint(fits, keep, data, cuda_graph, joint.optimizer_state_for(keep))
    bar.close()
    return [result for result in results if result is not None]


__all__ = ["joinable", "train_dynamics_together", "without_seed"]
