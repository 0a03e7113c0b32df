"""Training the dynamics ensemble (PETS/MBPO recipe, CBOP appendix B.2), and its cache.

Recipe, all members at once (one batched optimizer step updates every member):

1. Rows with ``dynamics_mask`` (no timeouts, no cut episode ends) are split
   into a holdout of ``min(holdout_ratio * N, max_holdout)`` rows and a
   training split; inputs/targets are standardized with training-split
   statistics.
2. Member ``e`` trains on its own bootstrap resample of the training split
   (an ``[E, N_train]`` index tensor, reshuffled per member each epoch; with
   ``bootstrap_per_epoch``, as in the authors' code, drawn afresh each epoch), with
   the Gaussian NLL in standardized units, ``0.01 * (sum max_logvar - sum
   min_logvar)`` and MBPO's per-layer L2 weight decay (2.5e-5, 5e-5, 7.5e-5,
   7.5e-5, 1e-4 for the 4 hidden + output layers; applied through Adam's
   ``weight_decay``, which adds the same gradient as the L2 loss term).
3. After each epoch every member's holdout MSE (standardized units, mean
   over output dims) is compared with its best: a member that improved by
   more than 1% gets a new snapshot. Training stops after ``patience``
   epochs in which no member improved (or at ``max_epochs``); each member is
   restored to its snapshot and the ``num_elites`` lowest-MSE members are the
   elites.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tqdm.auto import tqdm

from cbop_torchrl.accel import CapturedStep
from cbop_torchrl.config import DynamicsConfig
from cbop_torchrl.io import (
    atomic_json_dump,
    cache_dir,
    cache_entry_lock,
    config_hash,
    describe_load_error,
)
from cbop_torchrl.modules.dynamics import (
    DynamicsModel,
    GaussianEnsemble,
    dynamics_from_state,
    dynamics_state,
)
from cbop_torchrl.trainers.checkpoint import read_stage, save_stage
from cbop_torchrl.trainers.dynamics_quality import (
    EVAL_CHUNK,
    _Split,
    check_trained_dynamics,
    dynamics_rows,
    holdout_metrics,
    non_finite_parts,
)


def split_holdout(
    num_rows: int, config: DynamicsConfig, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(holdout_idx, train_idx)``: a random holdout of ``min(ratio * N, max_holdout)`` rows.

    With ``generator=None`` it is the split :func:`train_dynamics` uses for ``config.seed``.
    """
    num_holdout = min(int(num_rows * config.holdout_ratio), config.max_holdout)
    if num_holdout < 1 or num_rows - num_holdout < 2:
        raise ValueError(
            f"only {num_rows} usable transitions (dynamics_mask True); need enough for a "
            f"holdout of {config.holdout_ratio:.0%} and at least 2 training rows"
        )
    generator = generator or torch.Generator().manual_seed(config.seed)
    order = torch.randperm(num_rows, generator=generator)
    return order[:num_holdout], order[num_holdout:]


def _build_ensemble(
    config: DynamicsConfig, obs_dim: int, action_dim: int, bound_groups: int = 1
) -> GaussianEnsemble:
    return GaussianEnsemble(
        obs_dim,
        action_dim,
        num_members=config.num_members,
        hidden_sizes=(config.hidden_size,) * config.num_layers,
        activation=config.activation,
        separate_reward=config.separate_reward,
        shared_logvar_bounds=config.shared_logvar_bounds,
        bound_groups=bound_groups,
    )


@torch.no_grad()
def holdout_losses(
    ensemble: GaussianEnsemble, inputs_n: torch.Tensor, targets_n: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-member holdout MSE and Gaussian NLL in standardized units.

    Args:
        inputs_n: standardized ``[N, O + A]`` holdout inputs (shared by all members).
        targets_n: standardized ``[N, O + 1]`` targets.

    Returns:
        ``mse [E]`` and ``nll [E]`` (both means over rows and output dims; the
        NLL omits the constant ``0.5 * log(2 pi)`` and the factor 1/2).
    """
    sq_err = torch.zeros(ensemble.num_members, device=inputs_n.device)
    nll = torch.zeros_like(sq_err)
    for x, y in zip(inputs_n.split(EVAL_CHUNK), targets_n.split(EVAL_CHUNK), strict=True):
        mean, logvar = ensemble(x, per_member=False)
        err2 = (mean - y).pow(2)
        sq_err += err2.sum(dim=(1, 2))
        nll += (err2 * torch.exp(-logvar) + logvar).sum(dim=(1, 2))
    count = targets_n.numel()
    return sq_err / count, nll / count


def minibatch_step(
    ensemble: GaussianEnsemble,
    optimizer: torch.optim.Optimizer,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    config: DynamicsConfig,
) -> Callable[[TensorDictBase], TensorDictBase]:
    """One Adam step of every member on its rows ``batch["index"]`` ``[E, b]``; returns its NLL
    (``nll``, summed over members, and ``member_nll [E]``).

    A function of the batch of indices alone (the data are captured by reference), so a
    :class:`~cbop_torchrl.accel.CapturedStep` can record it as a CUDA graph.
    """

    def step(batch: TensorDictBase) -> TensorDictBase:
        batch_idx = batch.get("index")
        x, y = train_x[batch_idx], train_y[batch_idx]  # [E, b, O + A], [E, b, O + 1]
        mean, logvar = ensemble(x, per_member=True)
        # Gaussian NLL (up to constants), mean over rows and dims, summed over members.
        member_nll = ((mean - y).pow(2) * torch.exp(-logvar) + logvar).mean(dim=(1, 2))
        nll = member_nll.sum()
        loss = nll + config.logvar_bound_coef * ensemble.logvar_bound_penalty()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return TensorDict({"nll": nll.detach(), "member_nll": member_nll.detach()}, [])

    return step


def make_minibatch_step(
    ensemble: GaussianEnsemble,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    config: DynamicsConfig,
    cuda_graph: bool = False,
) -> tuple[Callable[[TensorDictBase], TensorDictBase], CapturedStep | None]:
    """The training's fused Adam (capturable with ``cuda_graph``), its :func:`minibatch_step`
    and, with ``cuda_graph``, that step captured as a CUDA graph."""
    optimizer = torch.optim.Adam(
        ensemble.param_groups(config.weight_decay), lr=config.lr, fused=True,
        capturable=cuda_graph,
    )  # fmt: skip
    step = minibatch_step(ensemble, optimizer, train_x, train_y, config)
    return step, CapturedStep(step) if cuda_graph else None


def epoch_indices(
    bootstrap: torch.Tensor, shuffle_gen: torch.Generator, config: DynamicsConfig
) -> torch.Tensor:
    """The ``[E, N]`` rows one epoch visits, member ``e`` its row in minibatch order.

    Args:
        bootstrap: ``[E, N]`` row indices; row ``e`` is member ``e``'s resample (with
            ``config.bootstrap_per_epoch`` only its shape is used: each epoch draws its own).
        shuffle_gen: the training's generator; one draw of ``[E, N]`` per epoch.
    """
    num_members, num_train = bootstrap.shape
    if config.bootstrap_per_epoch:
        # The authors' code (rlkit/trainers/mbrl/mbrl.py:186): a new resample per member and
        # epoch, used in the order drawn.
        return torch.randint(
            num_train, (num_members, num_train), generator=shuffle_gen, device=bootstrap.device
        )
    # Per-member reshuffle of that member's bootstrap indices.
    keys = torch.rand(num_members, num_train, generator=shuffle_gen, device=bootstrap.device)
    return bootstrap.gather(1, keys.argsort(dim=1))


def train_epoch(
    step: Callable[[TensorDictBase], TensorDictBase],
    bootstrap: torch.Tensor,
    shuffle_gen: torch.Generator,
    config: DynamicsConfig,
    captured: CapturedStep | None = None,
) -> torch.Tensor:
    """One pass of every member over its bootstrap resample; returns the mean NLL per member.

    Args:
        step: :func:`minibatch_step`.
        bootstrap: ``[E, N]`` row indices; row ``e`` is member ``e``'s resample (with
            ``config.bootstrap_per_epoch`` only its shape is used: each epoch draws its own).
        captured: ``step`` captured as a CUDA graph, used for the full-size minibatches
            (a smaller last one runs ``step`` eagerly).
    """
    num_members = bootstrap.shape[0]
    epoch_idx = epoch_indices(bootstrap, shuffle_gen, config)
    nll_sum = torch.zeros((), device=bootstrap.device)
    batches = epoch_idx.split(config.batch_size, dim=1)
    for batch_idx in batches:  # [E, b]
        full = batch_idx.shape[1] == config.batch_size
        run = captured if captured is not None and full else step
        nll_sum += run(TensorDict({"index": batch_idx}, batch_size=[])).get("nll")
    return nll_sum / (len(batches) * num_members)


@torch.no_grad()
def _update_snapshots(
    best_params: dict[str, torch.Tensor], ensemble: GaussianEnsemble, improved: torch.Tensor
) -> None:
    """Copies the parameters of the members flagged in ``improved [E]`` into ``best_params``.

    Every parameter has the member dim first, so this is one ``where`` per tensor. One shared
    by all members (``shared_logvar_bounds``: a member dim of 1) is copied when any member
    improved, as the authors' code keeps its shared bounds (their torch_rl_algorithm.py:284).
    """
    for name, param in ensemble.named_parameters():
        if param.shape[0] != improved.shape[0]:
            mask = improved.any()
        else:
            mask = improved.view(-1, *([1] * (param.dim() - 1)))
        best_params[name] = torch.where(mask, param, best_params[name])


@dataclass
class DynamicsFit:
    """One ensemble's training as :func:`train_dynamics` sets it up from ``config.seed``.

    Attributes:
        config: the settings (``config.seed`` draws everything below).
        ensemble: the initialised ensemble, its normalizer set from the training split.
        holdout: the raw-unit holdout rows (``[H, ...]``, for :func:`holdout_metrics`).
        train_x, train_y: the standardized training split ``[N, O + A]``, ``[N, O + 1]``.
        hold_x, hold_y: the standardized holdout ``[H, O + A]``, ``[H, O + 1]``.
        bootstrap: ``[E, N]`` each member's resample of the training split.
        shuffle_gen: the generator of each epoch's order (:func:`epoch_indices`).
    """

    config: DynamicsConfig
    ensemble: GaussianEnsemble
    holdout: _Split
    train_x: torch.Tensor
    train_y: torch.Tensor
    hold_x: torch.Tensor
    hold_y: torch.Tensor
    bootstrap: torch.Tensor
    shuffle_gen: torch.Generator

    @property
    def num_train(self) -> int:
        return self.train_x.shape[0]


def prepare_fit(rows: _Split, config: DynamicsConfig) -> DynamicsFit:
    """The split, initialisation, normalizer, bootstrap and shuffle generator of
    ``config.seed``, on the device of ``rows`` (:func:`dynamics_rows`).

    Split, bootstrap and initialisation come from CPU generators, so a seed gives the same
    ensemble on every device; the process's random streams are left as they were.
    """
    device = rows.obs.device
    num_rows, obs_dim = rows.obs.shape
    cpu_gen = torch.Generator().manual_seed(config.seed)
    hold_idx, train_idx = (idx.to(device) for idx in split_holdout(num_rows, config, cpu_gen))
    holdout = _Split(rows.obs[hold_idx], rows.action[hold_idx], rows.target[hold_idx])
    train = _Split(rows.obs[train_idx], rows.action[train_idx], rows.target[train_idx])
    num_train = train_idx.numel()

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        ensemble = _build_ensemble(config, obs_dim, rows.action.shape[1])
    ensemble = ensemble.to(device)
    ensemble.set_normalizer(torch.cat([train.obs, train.action], -1), train.target)
    bootstrap = torch.randint(num_train, (config.num_members, num_train), generator=cpu_gen)
    return DynamicsFit(
        config, ensemble, holdout,
        ensemble.normalize_inputs(train.obs, train.action),
        ensemble.normalize_targets(train.target),
        ensemble.normalize_inputs(holdout.obs, holdout.action),
        ensemble.normalize_targets(holdout.target),
        bootstrap.to(device), torch.Generator(device=device).manual_seed(config.seed + 1),
    )  # fmt: skip


def finish_fit(
    fit: DynamicsFit, termination: str, epochs: int, start_time: float
) -> tuple[DynamicsModel, dict[str, Any]]:
    """The trained ``fit`` (each member at its best snapshot) as a model of its
    ``num_elites`` lowest-holdout-MSE members, and the metrics :func:`train_dynamics` returns."""
    mse, nll = holdout_losses(fit.ensemble, fit.hold_x, fit.hold_y)
    elites = mse.argsort()[: fit.config.num_elites]
    model = DynamicsModel(fit.ensemble, termination, elites.cpu().tolist())
    metrics = holdout_metrics(model, fit.holdout)
    metrics.update(
        elites=elites.tolist(),
        holdout_mse_per_member=mse.tolist(),
        holdout_nll_per_member=nll.tolist(),
        holdout_mse_elites=mse[elites].mean().item(),
        epochs=epochs,
        num_train=fit.num_train,
        num_holdout=fit.hold_x.shape[0],
        wall_time_s=time.perf_counter() - start_time,
    )
    return model, metrics


def train_dynamics(
    dataset_td: TensorDictBase,
    termination: str,
    config: DynamicsConfig | None = None,
    progress: bool = True,
    log_fn: Callable[[dict[str, Any]], None] | None = None,
    cuda_graph: bool = False,
) -> tuple[DynamicsModel, dict[str, Any]]:
    """Trains a :class:`GaussianEnsemble` on ``dataset_td`` and selects its elites.

    Runs on the device of the dataset's tensors; with ``cuda_graph`` (a CUDA device) each
    full-size minibatch step is one replay of a CUDA graph (the same arithmetic).
    :mod:`cbop_torchrl.trainers.joint_dynamics` trains several seeds' ensembles as this
    does, in one.

    Args:
        dataset_td: dataset TensorDict ``[N]`` (see ``cbop_torchrl.data.load_dataset``).
        termination: registered termination function name of the model's rollouts.
        config: settings (paper defaults if None).
        progress: show a tqdm bar over epochs.
        log_fn: called after every epoch with a dict of scalars: ``epoch``,
            ``train_loss``, ``holdout_mse`` and ``holdout_nll`` (means over
            members), ``holdout_mse_best`` (mean of the members' best MSE),
            ``epochs_since_improvement``.

    Returns:
        The model (elites in ascending holdout-MSE order) and a metrics dict
        with ``holdout_r2_mean``, ``holdout_r2_per_dim``, ``coverage_2sigma``,
        ``elites``, ``holdout_mse_per_member``, ``epochs``, ``wall_time_s``,
        ``num_train``, ``num_holdout``.
    """
    config = config or DynamicsConfig()
    start_time = time.perf_counter()
    fit = prepare_fit(dynamics_rows(dataset_td), config)
    steps = make_minibatch_step(fit.ensemble, fit.train_x, fit.train_y, config, cuda_graph)
    epoch = _fit_with_early_stopping(fit, steps, progress, log_fn)
    return finish_fit(fit, termination, epoch, start_time)


class EarlyStopping:
    """Each member's best holdout MSE and snapshot, and the patience rule over them.

    After each epoch :meth:`after_epoch` is given every member's holdout MSE: a member that
    improved by more than ``config.improvement_threshold`` (relative) takes a new snapshot;
    :attr:`done` once ``config.patience`` epochs pass with no member improving (or at
    ``config.max_epochs``); :meth:`restore` then gives every member its best snapshot.
    """

    def __init__(self, ensemble: GaussianEnsemble, config: DynamicsConfig) -> None:
        self.config = config
        self.best_params = {n: p.detach().clone() for n, p in ensemble.named_parameters()}
        self.best_mse = torch.full(
            (config.num_members,), math.inf, device=ensemble.input_mean.device
        )
        self.epoch, self.epochs_since_improvement, self.done = 0, 0, False

    def after_epoch(
        self,
        ensemble: GaussianEnsemble,
        mse: torch.Tensor,
        nll: torch.Tensor,
        train_nll: torch.Tensor,
    ) -> dict[str, Any]:
        """Takes the epoch's holdout ``mse [E]`` and ``nll [E]`` and the mean training NLL;
        returns the epoch's record (see :func:`train_dynamics`'s ``log_fn``)."""
        config = self.config
        self.epoch += 1
        improved = (self.best_mse - mse) / self.best_mse > config.improvement_threshold
        improved |= torch.isinf(self.best_mse)
        _update_snapshots(self.best_params, ensemble, improved)
        self.best_mse = torch.where(improved, mse, self.best_mse)
        since = 0 if bool(improved.any()) else self.epochs_since_improvement + 1
        self.epochs_since_improvement = since
        capped = config.max_epochs is not None and self.epoch >= config.max_epochs
        self.done = since >= config.patience or capped
        return {
            "epoch": self.epoch,
            "train_loss": train_nll.item(),
            "holdout_mse": mse.mean().item(),
            "holdout_nll": nll.mean().item(),
            "holdout_mse_best": self.best_mse.mean().item(),
            "epochs_since_improvement": since,
        }

    def restore(self, ensemble: GaussianEnsemble) -> None:
        """Every member takes its best snapshot."""
        ensemble.load_state_dict(self.best_params, strict=False)


def _fit_with_early_stopping(
    fit: DynamicsFit,
    steps: tuple[Callable[[TensorDictBase], TensorDictBase], CapturedStep | None],
    progress: bool,
    log_fn: Callable[[dict[str, Any]], None] | None,
) -> int:
    """Epochs of :func:`train_epoch` under :class:`EarlyStopping`; then every member takes
    its best snapshot. Returns the number of epochs.

    Args:
        steps: :func:`make_minibatch_step`'s step and its captured CUDA graph (or None).
    """
    step, captured = steps
    ensemble, config = fit.ensemble, fit.config
    stopping = EarlyStopping(ensemble, config)
    bar = tqdm(total=config.max_epochs, desc="dynamics", unit="epoch", disable=not progress)
    while not stopping.done:
        ensemble.train()
        train_nll = train_epoch(step, fit.bootstrap, fit.shuffle_gen, config, captured)
        ensemble.eval()
        mse, nll = holdout_losses(ensemble, fit.hold_x, fit.hold_y)
        record = stopping.after_epoch(ensemble, mse, nll, train_nll)
        if log_fn is not None:
            log_fn(record)
        bar.update(1)
        bar.set_postfix(mse=f"{record['holdout_mse']:.4f}", nll=f"{record['holdout_nll']:.3f}")
    bar.close()
    stopping.restore(ensemble)
    return stopping.epoch


def dynamics_cache_key(info: Any, config: DynamicsConfig) -> str:
    """Cache key of a trained ensemble: dataset fingerprint and the full config.

    The termination function is applied at load time, so it is not part of the key.
    """
    return config_hash({"dataset": info.fingerprint, "config": config.to_dict()})


def _data_record(info: Any) -> dict[str, Any]:
    """The record of the data a cached ensemble is trained on: :func:`cbop_torchrl.data.
    data_record` where ``info`` is a ``DatasetInfo``, with the fingerprint the cache key
    uses (actions rescaled to [-1, 1] change it)."""
    try:
        from cbop_torchrl.data import data_record

        record = data_record(info)
    except Exception:  # a stand-in with a name and a fingerprint only (tests, the API)
        record = {"name": getattr(info, "name", None)}
    record["fingerprint"] = info.fingerprint
    return record


def load_or_train_dynamics(
    dataset_td: TensorDictBase,
    info: Any,
    config: DynamicsConfig | None = None,
    progress: bool = True,
    log_fn: Callable[[dict[str, Any]], None] | None = None,
    use_cache: bool = True,
    *,
    termination: str,
    cuda_graph: bool = False,
) -> tuple[DynamicsModel, dict[str, Any]]:
    """A trained ensemble for ``dataset_td``, from the cache when one exists.

    The cache entry ``cache_dir("dynamics", key)`` (``model.pt`` +
    ``metrics.json``) is keyed by ``info.fingerprint`` and every field of
    ``config``. The returned metrics carry ``cached`` (bool) and ``cache_path``.

    Args:
        dataset_td: the dataset TensorDict; training runs on its device.
        info: its ``DatasetInfo`` (``.name``, ``.fingerprint``).
        config: dynamics settings (paper defaults if None).
        progress, log_fn: see :func:`train_dynamics`.
        use_cache: False always trains (and then refreshes the cache entry).
        termination: the task's registered termination function name (``task.termination``).
        cuda_graph: capture the minibatch step as a CUDA graph (see :func:`train_dynamics`).
    """
    config = config or DynamicsConfig()
    directory = dynamics_entry(info, config)
    record = _data_record(info)
    with cache_entry_lock(directory, "dynamics model"):
        if use_cache:
            device = dataset_td.get("observation").device
            if (cached := read_cached_dynamics(directory, record, device, termination)) is not None:
                return cached
        model, metrics = train_dynamics(
            dataset_td, termination, config, progress, log_fn, cuda_graph=cuda_graph
        )
        check_trained_dynamics(model, metrics, config, dataset_td)
        return model, store_dynamics(model, metrics, info, config, directory)


def dynamics_entry(info: Any, config: DynamicsConfig) -> Path:
    """The cache entry's folder of the ensemble trained on ``info``'s data with ``config``
    (``model.pt`` and ``metrics.json``; hold :func:`~cbop_torchrl.io.cache_entry_lock` on it
    to read or write them)."""
    return cache_dir("dynamics", dynamics_cache_key(info, config))


def read_cached_dynamics(
    directory: Path, record: dict[str, Any], device: torch.device, termination: str
) -> tuple[DynamicsModel, dict[str, Any]] | None:
    """The model and metrics of the cache entry ``directory`` (on ``device``, ``cached``
    True), or None when it has none that may be used: no ``model.pt`` or ``metrics.json``
    (a writer killed between the two), or a damaged, other data's or non-finite one (a
    warning names it; it is trained again and replaced)."""
    model_path, metrics_path = directory / "model.pt", directory / "metrics.json"
    state = read_stage(model_path, record, "dynamics model")
    if state is None or not metrics_path.exists():
        return None
    try:
        model = dynamics_from_state(state, model_path, device, termination=termination)
        metrics = json.loads(metrics_path.read_text())
        if bad := non_finite_parts(model, metrics):  # cached by an earlier version
            raise ValueError(f"its {', '.join(bad[:3])} are not finite")
    except Exception as error:  # a corrupt entry is retrained, not fatal
        warnings.warn(
            f"the dynamics cache file {model_path} cannot be read "
            f"({describe_load_error(error, model_path)}); the dynamics model is trained "
            "again and replaces it",
            stacklevel=3,
        )
        return None
    metrics.update(cached=True, cache_path=str(model_path))
    return model, metrics


def store_dynamics(
    model: DynamicsModel,
    metrics: dict[str, Any],
    info: Any,
    config: DynamicsConfig,
    directory: Path,
) -> dict[str, Any]:
    """Writes a trained (and checked, :func:`check_trained_dynamics`) model into its cache
    entry ``directory``, under its lock: ``model.pt`` then ``metrics.json``, each atomically,
    so a kill leaves no entry that :func:`read_cached_dynamics` uses. Returns ``metrics``
    with ``dataset``, ``config``, ``cached`` (False) and ``cache_path``."""
    model_path = directory / "model.pt"
    metadata = {"dataset": info.name, "config": config.to_dict()}
    save_stage(dynamics_state(model, metadata), model_path, _data_record(info))
    metrics.update(dataset=info.name, config=config.to_dict())
    atomic_json_dump(metrics, directory / "metrics.json")
    metrics.update(cached=False, cache_path=str(model_path))
    return metrics
