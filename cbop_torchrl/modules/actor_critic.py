"""The actor and the Q-network of the EDAC-style SAC that CBOP trains, and the baselines' actors.

Both are plain TorchRL modules, so they plug into ``SACLoss`` unchanged: the
actor is a ``ProbabilisticActor`` over a tanh-squashed Gaussian
(:class:`BoxTanhNormal`); a Q-network is a
``ValueOperator`` reading ``observation`` and ``action`` and writing
``state_action_value``. The Q-ensemble is a list of M such networks, which
``SACLoss`` stacks into one ``[M, ...]`` parameter TensorDict and runs with
``vmap`` (one batched matmul per layer). With randomised priors
(``prior_scale > 0``, beyond the paper) each member's fixed prior network rides
in that TensorDict as buffers, which no optimizer or target update changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import distributions as D
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor, TanhModule, ValueOperator

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0


class ClampedLogStdHead(nn.Module):
    """Splits ``[..., 2 * A]`` features into ``loc`` and ``scale = exp(clamp(log_std))``.

    TorchRL's ``NormalParamExtractor`` bounds the scale from below only; CBOP's
    reference actor (like EDAC's) clamps the log-std on both sides, so that
    the entropy bonus cannot push the policy to an unbounded scale.
    """

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, log_std = features.chunk(2, dim=-1)
        return loc, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()


class _ClampedTanhTransform(D.TanhTransform):
    """``tanh`` whose inverse clamps ``y`` inside ``(-1, 1)``: an action of exactly
    +-1 (clipped data) gets a finite ``atanh`` and hence a finite log-density."""

    def _inverse(self, y: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(y.dtype).eps
        return torch.atanh(y.clamp(-1.0 + eps, 1.0 - eps))


class BoxTanhNormal(D.TransformedDistribution):
    """``Normal(loc, scale)`` per action dimension, squashed by ``tanh`` into a static box.

    The same law as TorchRL's ``TanhNormal(loc, scale, low, high)`` (diagonal
    Gaussian, ``tanh``, then the affine map onto ``[low, high]`` unless the box
    is ``[-1, 1]``), for bounds given as Python numbers. Why not ``TanhNormal``
    itself: it checks its bounds with tensor comparisons read back by Python
    (``(high > low).all()``, ``non_trivial_max or non_trivial_min``) each time
    it is built, two host synchronisations per distribution, seven
    distributions per CBOP gradient step (checked against TorchRL 0.14.1).
    Static bounds are checked once, in Python.

    ``rsample()``/``sample()`` cache their pre-tanh draw (``cache_size=1``), so
    ``log_prob`` of the action just drawn uses it instead of ``atanh``;
    ``deterministic_sample`` is the squashed mean (what TorchRL's actors use
    under ``ExplorationType.DETERMINISTIC``).

    Args:
        loc, scale: ``[*batch, A]`` pre-tanh mean and std.
        low, high: the action box's bounds, Python numbers.
    """

    arg_constraints = {"loc": D.constraints.real, "scale": D.constraints.positive}
    has_rsample = True

    def __init__(
        self, loc: torch.Tensor, scale: torch.Tensor, low: float = -1.0, high: float = 1.0
    ) -> None:
        if not (isinstance(low, Real) and isinstance(high, Real)):
            raise TypeError(
                f"BoxTanhNormal needs Python numbers as bounds (got {type(low).__name__} and "
                f"{type(high).__name__}); use torchrl.modules.TanhNormal for tensor bounds."
            )
        if not high > low:
            raise ValueError(f"BoxTanhNormal needs high > low; got low={low}, high={high}.")
        self.loc, self.scale = loc, scale
        self.low, self.high = float(low), float(high)
        base = D.Independent(D.Normal(loc, scale, validate_args=False), 1, validate_args=False)
        transforms: list[D.Transform] = [_ClampedTanhTransform(cache_size=1)]
        if (self.low, self.high) != (-1.0, 1.0):
            middle, half = (self.high + self.low) / 2, (self.high - self.low) / 2
            transforms.append(D.AffineTransform(middle, half, event_dim=1, cache_size=1))
        super().__init__(base, transforms, validate_args=False)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        """A draw without gradient ``[*sample_shape, *batch, A]``: ``rsample`` under ``no_grad``.

        Not ``Normal.sample``: its ``torch.normal(loc, scale)`` checks ``scale >= 0`` on the
        host, a synchronisation per draw on CUDA. The same standard-normal draws, so the
        same values.
        """
        with torch.no_grad():
            return self.rsample(sample_shape)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The squashed mean ``[*batch, A]``."""
        action = self.loc
        for transform in self.transforms:
            action = transform(action)
        return action


def action_spec(action_dim: int, device: torch.device | str | None = None) -> Bounded:
    """The ``[-1, 1]^A`` action box of the MuJoCo locomotion tasks."""
    return Bounded(-1.0, 1.0, shape=(action_dim,), device=device)


def _probabilistic_actor(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: Sequence[int],
    features: int,
    head: nn.Module,
    distribution: tuple[type, dict],
    device: torch.device | str | None,
) -> ProbabilisticActor:
    """``observation -> MLP -> head -> (loc, scale) -> distribution`` over the action box."""
    net = MLP(
        in_features=obs_dim,
        out_features=features,
        num_cells=list(hidden_sizes),
        activation_class=nn.ReLU,
        device=device,
    )
    params = TensorDictModule(
        nn.Sequential(net, head), in_keys=["observation"], out_keys=["loc", "scale"]
    )
    return ProbabilisticActor(
        params,
        in_keys=["loc", "scale"],
        spec=action_spec(action_dim, device),
        distribution_class=distribution[0],
        distribution_kwargs=distribution[1],
        return_log_prob=False,
    )


def make_actor(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: tuple[int, ...] = (256, 256, 256),
    device: torch.device | str | None = None,
) -> ProbabilisticActor:
    """A tanh-Gaussian policy ``observation [..., obs_dim] -> action [..., action_dim]``.

    The MLP has ReLU hidden layers; its ``2 * action_dim`` outputs become the
    pre-tanh mean and a clamped log-std. Call it under
    ``set_exploration_type(ExplorationType.DETERMINISTIC)`` for the tanh of
    the mean (evaluation), or ``RANDOM`` for samples (training).
    """
    distribution = (BoxTanhNormal, {"low": -1.0, "high": 1.0})
    return _probabilistic_actor(
        obs_dim, action_dim, hidden_sizes, 2 * action_dim, ClampedLogStdHead(), distribution, device
    )


def make_deterministic_actor(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: Sequence[int] = (256, 256, 256),
    device: torch.device | str | None = None,
) -> TensorDictSequential:
    """TD3's actor: ``observation [..., obs_dim] -> action = tanh(MLP(obs)) [..., action_dim]``."""
    net = MLP(
        in_features=obs_dim,
        out_features=action_dim,
        num_cells=list(hidden_sizes),
        activation_class=nn.ReLU,
        device=device,
    )
    return TensorDictSequential(
        TensorDictModule(net, in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=action_spec(action_dim, device)),
    )


GAUSSIAN_LOG_STD_MIN = -5.0
GAUSSIAN_LOG_STD_MAX = 2.0


class TanhMeanHead(nn.Module):
    """``[..., A]`` features -> ``loc = tanh(features)`` and a state-independent ``scale``.

    ``scale = exp(clamp(log_std, GAUSSIAN_LOG_STD_MIN, GAUSSIAN_LOG_STD_MAX))``, expanded to
    ``[..., A]``; ``log_std`` is one learned ``[A]`` parameter starting at 0. IQL's actor for
    D4RL locomotion in its authors' code (ikostrikov/implicit_q_learning, ``learner.py``:
    ``NormalTanhPolicy(..., log_std_min=-5.0, state_dependent_std=False,
    tanh_squash_distribution=False)``, ``policy.py``'s clip at 2.0).
    """

    def __init__(self, action_dim: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.log_std = nn.Parameter(torch.zeros(action_dim, device=device))

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = torch.tanh(features)
        scale = self.log_std.clamp(GAUSSIAN_LOG_STD_MIN, GAUSSIAN_LOG_STD_MAX).exp()
        return loc, scale.expand_as(loc)


def make_tanh_mean_gaussian_actor(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: Sequence[int] = (256, 256),
    device: torch.device | str | None = None,
) -> ProbabilisticActor:
    """A Gaussian policy ``observation [..., obs_dim] -> action [..., action_dim]`` whose mean
    is ``tanh(MLP(obs))`` and whose std is state-independent (:class:`TanhMeanHead`).

    The Gaussian is not squashed: its log-density of a data action needs no ``atanh``, and
    under ``ExplorationType.DETERMINISTIC`` it acts with its mean, inside ``(-1, 1)``.
    """
    head = TanhMeanHead(action_dim, device)
    distribution = (IndependentNormal, {"validate_args": False})
    return _probabilistic_actor(
        obs_dim, action_dim, hidden_sizes, action_dim, head, distribution, device
    )


ACTOR_BUILDERS = {
    "tanh_normal": make_actor,
    "deterministic": make_deterministic_actor,
    "tanh_mean_gaussian": make_tanh_mean_gaussian_actor,
}
"""The actors a policy file names by its ``actor_kind``, and what builds each."""


AUTHORS_HIDDEN_BIAS = 0.1
AUTHORS_LAST_LAYER_SCALE = 3e-3


@torch.no_grad()
def authors_q_init(net: nn.Module) -> None:
    """The Q-network initialisation of the authors' code (rlkit's ``fanin_init``).

    Hidden layers: weights uniform in ``+-1/sqrt(fan_in)``, biases ``0.1``; the output
    layer: weights and bias uniform in ``+-3e-3``, so every member starts near 0.1 * (the
    sum of its last hidden layer's activations) and the members differ only by their
    hidden weights.
    """
    layers = [module for module in net.modules() if isinstance(module, nn.Linear)]
    for layer in layers[:-1]:
        bound = layer.weight.shape[1] ** -0.5
        layer.weight.uniform_(-bound, bound)
        layer.bias.fill_(AUTHORS_HIDDEN_BIAS)
    layers[-1].weight.uniform_(-AUTHORS_LAST_LAYER_SCALE, AUTHORS_LAST_LAYER_SCALE)
    layers[-1].bias.uniform_(-AUTHORS_LAST_LAYER_SCALE, AUTHORS_LAST_LAYER_SCALE)


class RandomizedPriorQ(nn.Module):
    """``trainable(x) + prior_scale * prior(x)`` on ``x = cat(inputs, -1)``: a Q-network with a
    randomised prior function (Osband et al. 2018, "Randomized Prior Functions for Deep RL").

    ``trainable`` is trained as usual; ``prior`` is a network of the same architecture
    whose weights are BUFFERS, not parameters: no optimizer sees them, they get no
    gradient, and a Polyak target update copies them unchanged. Each member of an
    ensemble gets its own prior, so off the data the members inherit their priors'
    disagreement, which CBOP's LCB (it penalises the members' spread) reads.

    The state dict holds ``trainable.*`` (parameters) and ``prior.*`` (buffers).
    """

    def __init__(self, trainable: nn.Module, prior: nn.Module, prior_scale: float) -> None:
        super().__init__()
        self.trainable = trainable
        self.prior = _frozen_as_buffers(prior)
        self.prior_scale = float(prior_scale)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        x = torch.cat(inputs, dim=-1) if len(inputs) > 1 else inputs[0]
        return self.trainable(x) + self.prior_scale * self.prior(x)

    def extra_repr(self) -> str:
        return f"prior_scale={self.prior_scale}"


def _frozen_as_buffers(module: nn.Module) -> nn.Module:
    """``module`` with every parameter turned into a buffer of the same name (in place)."""
    for child in module.modules():
        for name, param in list(child.named_parameters(recurse=False)):
            delattr(child, name)
            child.register_buffer(name, param.detach().requires_grad_(False))
    return module


def _q_mlp(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: Sequence[int],
    device: torch.device | str | None,
    init: str,
    layer_norm: bool,
    *,
    prior: bool = False,
    generator: torch.Generator | None = None,
) -> MLP:
    """The Q-network's MLP ``[..., obs_dim + action_dim] -> [..., 1]`` (see :func:`make_qvalue`).

    ``prior=True`` builds a prior network: one draw from ``generator`` (the global CPU
    generator if None) seeds the CPU generator while the MLP is built on the CPU (inside
    ``fork_rng``, so the global stream is restored afterwards: with a ``generator`` it is
    left untouched); the MLP is then moved to ``device``. The same seed gives the same prior
    on any device.
    """
    if prior:
        seed = int(torch.randint(2**62, (), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            net = _q_mlp(obs_dim, action_dim, hidden_sizes, "cpu", init, layer_norm)
        return net.to(device)
    norm_kwargs = {}
    if layer_norm:
        # TorchRL's MLP (0.14) appends, after each hidden layer, [dropout,] norm and then
        # the activation: Linear -> LayerNorm -> ReLU, the order wanted here.
        norm_kwargs = {
            "norm_class": nn.LayerNorm,
            "norm_kwargs": [{"normalized_shape": width} for width in hidden_sizes],
        }
    if init not in ("torch", "authors"):
        raise ValueError(f"init={init!r}: use 'torch' or 'authors'")
    net = MLP(
        in_features=obs_dim + action_dim,
        out_features=1,
        num_cells=list(hidden_sizes),
        activation_class=nn.ReLU,
        device=device,
        **norm_kwargs,
    )
    if init == "authors":
        authors_q_init(net)
    return net


def make_qvalue(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: tuple[int, ...] = (256, 256, 256),
    device: torch.device | str | None = None,
    init: str = "torch",
    layer_norm: bool = False,
    prior_scale: float = 0.0,
    prior_generator: torch.Generator | None = None,
) -> ValueOperator:
    """One Q-network ``(observation, action) -> state_action_value [..., 1]``.

    ``init``: ``"torch"`` keeps PyTorch's default ``Linear`` initialisation;
    ``"authors"`` applies :func:`authors_q_init` (Linear layers only).

    ``layer_norm``: an option beyond the paper, whose critics are plain MLPs
    (``False``, the default, builds exactly those: the same modules, parameter
    names and random draws). ``True`` puts an ``nn.LayerNorm(width)`` (with its
    elementwise affine) between every hidden Linear and its ReLU, ``Linear ->
    LayerNorm -> ReLU``, as in RLPD and the LayerNorm critics of the offline-RL
    literature; the output Linear is unchanged. Normalising bounds the critics'
    features, so their extrapolation away from the data is tamer, and the
    members' disagreement there (what CBOP's and EDAC's uncertainty reads) can
    differ from the plain MLPs'. A LayerNorm draws no random numbers, so the
    Linear layers get the same initial weights as with ``layer_norm=False``.

    ``prior_scale``: beta of a randomised prior function, an option beyond the
    paper (``0``, the default, builds the paper's network exactly as above: the
    ``ValueOperator``'s module is the MLP itself). ``> 0`` makes the module a
    :class:`RandomizedPriorQ`, ``Q(s, a) = f(s, a) + prior_scale * p(s, a)``:
    ``f`` (``module.trainable``) is the MLP above, drawn first from the global
    generator (the same weights as with ``prior_scale=0``); ``p`` (``module.prior``)
    has the same architecture, ``layer_norm`` and ``init``, is drawn from
    ``prior_generator`` (one seed, see :func:`_q_mlp`; the global generator
    after ``f`` if None) and is held in buffers: never trained, never changed by
    target updates. Such a network is not a plain MLP, so the fused ensemble path
    (:func:`~cbop_torchrl.accel.fused_mlp.plain_mlp_plan`) leaves it to ``vmap``.
    """
    if not 0 <= prior_scale < float("inf"):
        raise ValueError(f"prior_scale must be a finite number >= 0; got {prior_scale}.")
    net = _q_mlp(obs_dim, action_dim, hidden_sizes, device, init, layer_norm)
    if prior_scale > 0:
        prior = _q_mlp(
            obs_dim, action_dim, hidden_sizes, device, init, layer_norm,
            prior=True, generator=prior_generator,
        )  # fmt: skip
        net = RandomizedPriorQ(net, prior, prior_scale)
    return ValueOperator(net, in_keys=["observation", "action"])


def make_qvalue_ensemble(
    num_members: int,
    obs_dim: int,
    action_dim: int,
    hidden_sizes: tuple[int, ...] = (256, 256, 256),
    device: torch.device | str | None = None,
    init: str = "torch",
    layer_norm: bool = False,
    prior_scale: float = 0.0,
    prior_seed: int | None = None,
) -> list[ValueOperator]:
    """``num_members`` independently initialised Q-networks (``init`` as :func:`make_qvalue`).

    Passed to ``SACLoss`` as a list (not one module with ``expand_dim``) so
    that every member keeps its own initialisation.

    ``layer_norm``: beyond the paper (its critics are plain MLPs): ``Linear ->
    LayerNorm -> ReLU`` hidden layers in every member, see :func:`make_qvalue`.
    The bounded features tame the members' extrapolation off the data, and so
    change their disagreement there. The fused ensemble path
    (:mod:`cbop_torchrl.accel.fused_mlp`) runs these networks too.

    ``prior_scale``: beyond the paper (0, the default: the paper's critics):
    every member gets its own fixed random prior network, ``Q_m = f_m + prior_scale
    * p_m`` (:func:`make_qvalue`). The priors come from one ``torch.Generator``
    seeded with ``prior_seed`` (``torch.initial_seed()`` if None), one draw per
    member, so the members' priors differ, the same seed gives the same priors, and
    the global generator is not touched: the trainable parts, and every draw after
    the ensemble, are those of ``prior_scale=0``. The fused path does not run these
    networks (``vmap`` does).
    """
    generator = None
    if prior_scale > 0:
        seed = torch.initial_seed() if prior_seed is None else int(prior_seed)
        generator = torch.Generator().manual_seed(seed)
    options = {"layer_norm": layer_norm, "prior_scale": prior_scale, "prior_generator": generator}
    return [
        make_qvalue(obs_dim, action_dim, hidden_sizes, device, init, **options)
        for _ in range(num_members)
    ]
