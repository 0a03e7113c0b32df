"""How much memory a run's configured sizes need, checked before anything is allocated.

A size typed by mistake (``agent.num_qvalue_nets=100000``, ``estimator.horizon=100000``,
``agent.hidden_sizes=[100000,100000]``, ``episodes=100000``) would otherwise grow the
process for minutes until a ``MemoryError`` traceback or the kernel's OOM killer ends it.
:func:`check_run_fits` and :func:`check_evaluation_fits` estimate the tensors the
configured networks, batches and rollouts need and refuse, naming the estimate, the
available figure and the setting to lower, what cannot fit; a model horizon longer than
any episode (``estimator.horizon`` above ``max(1000, eval.max_steps)``) is refused as well.

The estimate (float32, 4 bytes a number) is deliberately simple; it counts

- parameters: the Q-ensemble (M networks x 5 copies: weights, gradients, two Adam moments,
  target), the actor (x 4) and the dynamics ensemble (members x 4);
- the largest stage's activations: the dynamics' training batch, the critic's and the
  actor's training batch, or CBOP's target rollout, whose one Q call covers
  ``batch x (1 + H x K)`` rows through every member (``M x rows x width`` x 2 layers live),
  with the rollout's states and actions;
- FQE's bootstrap counts: ``agent.num_qvalue_nets x dataset rows`` bytes (8 bytes each when
  fitted to convergence), with its training batches;
- evaluation: :data:`BYTES_PER_EVAL_ENV` per environment run side by side plus the
  recorded rollout ``[episodes, max_steps, 2 x obs + action + 8]``.

What is available is the smallest of the machine's available memory and what the
process's own limits leave (``ulimit -v``/``-d``, a cgroup's memory limit).
It leaves out the dataset (already loaded when the check runs), the interpreter and
libraries (a few hundred MB) and allocator slack, so it is no upper bound on the process; it
is meant to refuse what surely cannot fit. The default (cpu) preset estimates 0.23 GB, the
paper preset 1.0 GB on hopper and 0.47 GB on walker2d/halfcheetah.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cbop_torchrl.accel.plans import DEFAULT_Q_CHUNK_ROWS

FLOAT_BYTES = 4
BYTES_PER_EVAL_ENV = 2 * 2**20
"""Host memory of one MuJoCo environment in TorchRL's ``SerialEnv``: 1.3-2.0 MB each
measured for Hopper-v4 (50 and 200 environments)."""
MAPPED_PER_EVAL_ENV = 24 * 2**20
"""Address space one MuJoCo simulation maps (its ``MjData`` arena): 23.5 MB each measured
for Hopper-v4 (100 environments), of which :data:`BYTES_PER_EVAL_ENV` are used; counted
against an address-space limit (``ulimit -v``) only."""


class MemoryLimitError(ValueError):
    """The configured sizes need more memory than the machine has available."""


@dataclass(frozen=True)
class Estimate:
    """Bytes a run needs, with the part each setting contributes (for the message)."""

    total: int
    parts: dict[str, int]
    # address space reserved beyond ``total`` and not touched: each MuJoCo simulation maps
    # about 24 MB (its MjData arena) of which it uses 1-2 MB; it counts against ulimit -v only
    mapped: int = 0

    def describe(self) -> str:
        shown = sorted(self.parts.items(), key=lambda item: -item[1])
        return ", ".join(f"{name} {format_bytes(size)}" for name, size in shown if size)


def format_bytes(size: float) -> str:
    """``12.3 GB`` (powers of 1024, one decimal)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TB"


def mlp_parameters(in_features: int, hidden: Sequence[int], out_features: int) -> int:
    """Weights and biases of an MLP ``in -> hidden... -> out``."""
    sizes = [int(in_features), *map(int, hidden), int(out_features)]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=False))


def available_memory(device: torch.device | str = "cpu") -> tuple[int, str] | None:
    """``(bytes, what they are)`` the run may still use on ``device``; None when unknown.

    CPU: the smallest of ``MemAvailable`` of ``/proc/meminfo`` (else free physical pages),
    what the process's limits leave (:func:`process_limits`: ``ulimit -v``/``-d`` less what
    it maps, a cgroup's ``memory.max`` less its usage). CUDA: the free memory of that GPU
    (``torch.cuda.mem_get_info``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free memory of {device}"
    found = process_limits()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "available memory (MemAvailable)"))
                break
    except (OSError, ValueError, IndexError):
        pass
    if not any(what.startswith("available") for _, what in found):
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            found.append((int(pages), "free physical memory"))
        except (ValueError, OSError, AttributeError):
            pass
    return min(found) if found else None


def _status_bytes(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmSize``, ``VmData``) in bytes; 0 if unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_limits() -> list[tuple[int, str]]:
    """What this process's own limits leave it: ``(bytes, what they are)`` for each limit set.

    The address-space and data-segment limits (``ulimit -v``, ``ulimit -d``) less what the
    process maps already, and its cgroup's memory limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) less the group's usage.
    """
    found: list[tuple[int, str]] = []
    try:
        import resource

        for limit, name, status in (
            (resource.RLIMIT_AS, "address-space limit (ulimit -v)", "VmSize"),
            (resource.RLIMIT_DATA, "data-segment limit (ulimit -d)", "VmData"),
        ):
            soft, _ = resource.getrlimit(limit)
            if soft != resource.RLIM_INFINITY and soft > 0:
                left = max(0, soft - _status_bytes(status))
                what = f"the process's {name} of {format_bytes(soft)}, less what it maps already,"
                found.append((left, what))
    except (ImportError, OSError, ValueError):
        pass
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup") / group.lstrip("/")
            limit, usage = base / "memory.max", base / "memory.current"
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / group.lstrip("/")
            limit, usage = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        else:
            continue
        size, used = _read_int(limit), _read_int(usage)
        if size is not None and size < 1 << 60 and used is not None:
            what = f"the memory limit of its cgroup ({format_bytes(size)}), less its usage,"
            found.append((max(0, size - used), what))
    return found


DYNAMICS_MODEL = "dynamics ensemble (dynamics.num_members x hidden_size x num_layers)"
DYNAMICS_BATCH = "dynamics training batch (dynamics.batch_size)"


def _dynamics_bytes(dynamics, obs_dim: int, action_dim: int) -> tuple[int, int]:
    """Bytes of the dynamics ensemble (weights, gradients, Adam's two moments) and of one
    training batch's activations (forward, backward, a copy)."""
    members = int(dynamics.num_members)
    hidden = [int(dynamics.hidden_size)] * int(dynamics.num_layers)
    params = members * mlp_parameters(obs_dim + action_dim, hidden, 2 * (obs_dim + 1))
    training = 3 * members * int(dynamics.batch_size) * sum(hidden)
    return 4 * params * FLOAT_BYTES, training * FLOAT_BYTES


def run_estimate(
    config, obs_dim: int, action_dim: int, rollouts: bool = True, num_rows: int = 0
) -> Estimate:
    """The bytes of :class:`~cbop_torchrl.config.RunConfig` ``config``'s tensors (module doc).

    ``rollouts``: False for a baseline (no model rollouts, no FQE stage; its critic sizes
    are the same). ``num_rows``: the dataset's transitions (FQE's bootstrap counts).
    """
    agent, dynamics, estimator = config.agent, config.dynamics, config.estimator
    M = int(agent.num_qvalue_nets or 1)
    actor_hidden = [int(w) for w in agent.hidden_sizes]
    critic_hidden = [int(w) for w in (agent.critic_hidden_sizes or actor_hidden)]
    obs, act = int(obs_dim), int(action_dim)
    q_params, actor_params = _network_parameters(config, obs, act)
    dyn_hidden = [int(dynamics.hidden_size)] * int(dynamics.num_layers)
    dyn_model, dyn_batch = _dynamics_bytes(dynamics, obs, act)

    batch = max(int(config.train.batch_size or 1), int(config.bc.batch_size),
                int(config.fqe.batch_size))  # fmt: skip
    training = 3 * batch * (M * sum(critic_hidden) + sum(actor_hidden))
    rollout = 0
    if rollouts:
        H, K = int(estimator.horizon or 0), int(dynamics.num_elites)
        rows = int(config.train.batch_size or 1) * (1 + H * K)
        # The fused Q call runs in blocks of DEFAULT_Q_CHUNK_ROWS rows, except compiled on CUDA.
        block = rows if config.compile else min(rows, DEFAULT_Q_CHUNK_ROWS)
        widest = max(critic_hidden, default=1)
        rollout = rows * (3 * (obs + act) + 4 * M + 2) + 2 * M * block * widest
        rollout += 2 * K * int(config.train.batch_size or 1) * max(dyn_hidden, default=1)
    environments = evaluation_environments(config.eval, num_rows)
    parts = {
        "Q-ensemble (agent.num_qvalue_nets x agent.hidden_sizes or critic_hidden_sizes)": 5
        * q_params
        * FLOAT_BYTES,
        "actor (agent.hidden_sizes)": 4 * actor_params * FLOAT_BYTES,
        DYNAMICS_MODEL: dyn_model,
    }
    stages = {
        (
            "training batches (the largest of train.batch_size, bc.batch_size and "
            "fqe.batch_size, x agent.num_qvalue_nets x widths)"
        ): training * FLOAT_BYTES,
        DYNAMICS_BATCH: dyn_batch,
        "CBOP target rollouts (train.batch_size x estimator.horizon x dynamics.num_elites x "
        "agent.num_qvalue_nets)": rollout * FLOAT_BYTES,
        # every evaluation: eval.episodes environments side by side, then as many MuJoCo
        # simulations as start states (envs/starts.py) and Q - MC states, each with its record
        "evaluation (the largest of eval.episodes, eval.start_states and eval.mc_states, "
        "each an environment run side by side)": evaluation_bytes(
            environments,
            int(config.eval.max_steps),
            obs,
            act,
        ),
    }
    if rollouts and num_rows:
        # FQE: each member's bootstrap resample counts, [M, rows] uint8 (int64 draws when
        # fitted to convergence), beside its training batches
        count_bytes = 8 if getattr(config.fqe, "converge", False) else 1
        stages[
            "FQE bootstrap counts (agent.num_qvalue_nets x dataset rows) and training batches"
        ] = M * int(num_rows) * count_bytes + 16 * int(num_rows) + training * FLOAT_BYTES
    largest = max(stages, key=stages.get)
    parts[largest] = stages[largest]  # the stages run one after another
    return Estimate(
        total=sum(parts.values()),
        parts=parts,
        mapped=environments * (MAPPED_PER_EVAL_ENV - BYTES_PER_EVAL_ENV),
    )


def _network_parameters(config, obs_dim: int, action_dim: int) -> tuple[int, int]:
    """The parameters of the whole Q-ensemble and of the actor (its mean and log-std heads)."""
    agent = config.agent
    actor_hidden = [int(w) for w in agent.hidden_sizes]
    critic_hidden = [int(w) for w in (agent.critic_hidden_sizes or actor_hidden)]
    q_params = int(agent.num_qvalue_nets or 1) * mlp_parameters(
        obs_dim + action_dim, critic_hidden, 1
    )
    return q_params, mlp_parameters(obs_dim, actor_hidden, 2 * action_dim)


def checkpoint_bytes(config, obs_dim: int, action_dim: int) -> int:
    """About the size of a run's checkpoint: the Q-ensemble (weights, target, Adam's two
    moments) and the actor (weights and its two moments), float32."""
    q_params, actor_params = _network_parameters(config, int(obs_dim), int(action_dim))
    return (4 * q_params + 3 * actor_params) * FLOAT_BYTES


def evaluation_environments(evaluation, num_rows: int = 0) -> int:
    """The most environments an evaluation holds at once: ``eval.episodes`` side by side, or
    one MuJoCo simulation per start state (``eval.start_states``, at most the dataset's rows)
    or per Q - MC state (``eval.mc_states``)."""
    states = [int(getattr(evaluation, key, 0) or 0) for key in ("start_states", "mc_states")]
    if num_rows:
        states = [min(count, int(num_rows)) for count in states]
    return max(int(evaluation.episodes), *states)


def evaluation_bytes(episodes: int, max_steps: int, obs_dim: int, action_dim: int) -> int:
    """Environments run side by side plus the recorded rollout (module doc)."""
    record = int(max_steps) * (2 * int(obs_dim) + int(action_dim) + 8) * FLOAT_BYTES
    return int(episodes) * (BYTES_PER_EVAL_ENV + record)


def _refuse_if_too_large(estimate: Estimate, device: torch.device | str, lower: str) -> None:
    found = available_memory(device)
    checks = [] if found is None else [(found, estimate.total)]
    if torch.device(device).type == "cpu" and estimate.mapped:
        for limit in process_limits():  # the address space MuJoCo maps counts there
            if "ulimit -v" in limit[1]:
                checks.append((limit, estimate.total + estimate.mapped))
    for (available, what), needed in checks:
        if needed <= available:
            continue
        mapped = (
            f", and its MuJoCo simulations map {format_bytes(estimate.mapped)} of address "
            "space besides"
            if needed > estimate.total
            else ""
        )
        raise MemoryLimitError(
            f"these settings need about {format_bytes(estimate.total)} ({estimate.describe()})"
            f"{mapped}, more than the {format_bytes(available)} of {what} on this machine, so "
            f"the run would end in an out-of-memory error. Lower {lower}"
        )


def check_run_fits(
    config,
    obs_dim: int,
    action_dim: int,
    device: torch.device | str,
    rollouts: bool = True,
    num_rows: int = 0,
) -> Estimate:
    """Raises :class:`MemoryLimitError` when :func:`run_estimate` exceeds what is available.

    Returns the estimate otherwise (it is not printed).
    """
    horizon, longest = int(config.estimator.horizon or 0), max(1000, int(config.eval.max_steps))
    if rollouts and horizon > longest:
        raise MemoryLimitError(
            f"estimator.horizon={horizon} model steps is longer than any episode (at most "
            f"{longest} steps here: eval.max_steps, and the MuJoCo tasks' 1000-step limit); "
            "such rollouts would take hours and their memory grows with H. Use a horizon of "
            "at most a few dozen steps (the paper uses estimator.horizon=10)"
        )
    estimate = run_estimate(config, obs_dim, action_dim, rollouts, num_rows)
    _refuse_if_too_large(
        estimate,
        device,
        "the settings of the largest part (in parentheses above; the paper uses "
        "agent.num_qvalue_nets <= 50, estimator.horizon <= 10, widths of 256 and batches "
        "of 256)",
    )
    return estimate


def check_dynamics_fits(
    dynamics, obs_dim: int, action_dim: int, device: torch.device | str
) -> Estimate:
    """Raises :class:`MemoryLimitError` when the dynamics ensemble alone cannot fit.

    ``dynamics``: a :class:`~cbop_torchrl.config.DynamicsConfig` (``cbop-train-dynamics``).
    Returns the estimate otherwise.
    """
    model, batch = _dynamics_bytes(dynamics, int(obs_dim), int(action_dim))
    estimate = Estimate(total=model + batch, parts={DYNAMICS_MODEL: model, DYNAMICS_BATCH: batch})
    _refuse_if_too_large(
        estimate, device, "the settings in parentheses above (the paper: 30 members of 4 x 200)"
    )
    return estimate


def check_evaluation_fits(episodes: int, max_steps: int, obs_dim: int, action_dim: int) -> Estimate:
    """Raises :class:`MemoryLimitError` when ``episodes`` environments run side by side
    (``cbop-evaluate``) cannot fit in the host's available memory."""
    size = evaluation_bytes(episodes, max_steps, obs_dim, action_dim)
    per_episode = max(1, size // max(1, int(episodes)))
    estimate = Estimate(
        total=size,
        parts={f"{episodes} episodes side by side": size},
        mapped=int(episodes) * (MAPPED_PER_EVAL_ENV - BYTES_PER_EVAL_ENV),
    )
    found = available_memory("cpu")
    bound = "" if found is None else f" (at most about {found[0] // per_episode} here)"
    _refuse_if_too_large(
        estimate,
        "cpu",
        f"episodes={episodes}{bound}: each episode runs in its own MuJoCo environment, all "
        "at once; for more episodes, run the command several times with another seed=",
    )
    return estimate
