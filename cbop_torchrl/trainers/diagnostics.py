"""Learning diagnostics: the measurements that explain a CBOP learning curve.

:class:`LearningDiagnostics` runs at every evaluation step (opt-in,
``eval.diagnostics=true``) and logs, under ``diag/``:

- **Value against reality.** The deterministic policy is run in the real
  environment from ``episodes`` resets; at every visited state the critic's
  ``Q(s_t, pi(s_t))`` (mean over members) is compared with the discounted
  Monte-Carlo return-to-go from ``s_t`` (``q_visited`` vs ``mc_visited``,
  and the same at the start states, ``q_start`` vs ``mc_start``). Only
  states whose return-to-go is complete enter (the episode terminated, or
  ``s_t`` is at least :data:`MC_TAIL` steps before the time limit).
- **Conservatism as the paper measures it** (when the task is given): from
  ``mc_states`` fixed dataset states restored in the real environment,
  ``Q(s, pi(s)) - MC(s)`` (``q_minus_mc_data``, the paper's Table 2 quantity),
  the same with the soft critic's entropy part removed
  (``q_minus_mc_data_no_entropy``; the part itself: ``entropy_part_data``), and
  ``q_data_states``, ``mc_data_states``
  (:func:`~cbop_torchrl.trainers.conservatism.dataset_conservatism`).
- **How far the policy moved.** On a fixed batch of dataset states:
  ``Q(s, a_data)`` against ``Q(s, pi(s))`` (``q_data``, ``q_pi``, and the
  member std at each, ``q_std_data``, ``q_std_pi``; and at uniformly random
  actions, ``q_uniform_minus_data``, ``q_std_uniform``: an ensemble whose
  spread does not grow off the data cannot be pessimistic there), the behaviour-cloning
  log-likelihood of the dataset actions ``log pi(a_data|s)`` (``bc_logprob``)
  and the distance ``||pi(s) - a_data||`` (``action_distance``).
- **Model error where the policy goes.** The elites' mean one-step
  prediction of ``[s' - s, r]`` against the real transition, as a mean
  squared error in units of the model's target std, on the real policy
  transitions (``model_error_policy``) and on dataset transitions
  (``model_error_data``), with the elites' disagreement on each
  (``model_disagreement_*``).
- **The LCB per horizon.** On the same dataset batch: ``mu_h - mu_0``
  (``horizon_gap_h``), ``sigma_h`` (``horizon_std_h``), the posterior weight
  ``w_h`` and the penalty ``psi * sigma`` actually subtracted (``lcb_penalty``).

The history is checkpointed with the trainer (so a resumed run keeps it)
and goes into ``results.json`` as ``diagnostics_history``.

With ``background`` (``eval.background=true``) a measurement due at step s runs in a worker
thread on a copy of the actor's and critics' weights taken at s, while training goes on;
its record carries s and is written in step order by the training thread. Only the LCB per
horizon (one batched model rollout, milliseconds) is measured in-line, because it draws from
the global random stream under ``fork_rng``; the other random draws (uniform actions, the
entropy samples) come from a generator of the measurement's own, so the worker never touches
the stream training draws from, and the records equal the in-line ones.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.record.loggers import Logger

from cbop_torchrl.envs.evaluate import DeterministicPolicy
from cbop_torchrl.objectives.posterior import gaussian_posterior
from cbop_torchrl.objectives.pretrain import ensemble_q
from cbop_torchrl.registry import Task
from cbop_torchrl.trainers.background import BackgroundMeasurementHook
from cbop_torchrl.trainers.conservatism import (
    MC_STATES,
    STATES_SEED,
    dataset_conservatism,
    soft_critic_alpha,
    start_states,
)
from cbop_torchrl.trainers.logging import log_scalars

MC_TAIL = 300
"""Steps of return-to-go required before a time limit (0.99^300 < 5% of the tail is lost)."""

#: Margin from the action box's edges (where log pi is infinite) for the logged
#: ``bc_logprob``. Training clips by ``objectives.pretrain.ACTION_EPS`` (1e-5); this stays
#: 1e-4, the value every logged curve so far was measured with, so curves stay comparable.
LOGGED_ACTION_EPS = 1e-4


class LearningDiagnostics(BackgroundMeasurementHook):
    """Measures value error, policy drift, model error and the LCB at evaluation steps.

    Args:
        loss: the CBOP loss (its actor, online Q-ensemble and value estimator).
        data: the dataset TensorDict (``observation``, ``action``, ``("next", ...)``).
        gym_id: the gymnasium id of the real environment.
        gamma: discount of the Monte-Carlo returns.
        interval: gradient steps between measurements (the evaluation interval).
        total_steps: the run's last step (measured by the pipeline itself).
        logger: a TorchRL logger or ``None``.
        num_states: size of the fixed dataset batch.
        episodes: real episodes per measurement.
        max_steps: episode cap.
        seed: seeds the dataset batch and the environments (the conservatism's dataset
            states are the same for every seed: ``conservatism.STATES_SEED``).
        task: the real environment with its keyword arguments; None skips the
            dataset-state conservatism.
        mc_states: dataset states of that measurement.
        background: measure in a worker thread beside training (module doc).
    """

    hook_name = "diagnostics"
    # The measurements submitted and not yet written; each result is (record, seconds).
    _pending: deque[Future[tuple[dict[str, float], float]]]

    def __init__(
        self,
        loss: Any,
        data: TensorDictBase,
        gym_id: str,
        gamma: float,
        interval: int,
        total_steps: int,
        logger: Logger | None,
        num_states: int = 1024,
        episodes: int = 5,
        max_steps: int = 1000,
        seed: int = 0,
        task: Task | None = None,
        mc_states: int = MC_STATES,
        background: bool = False,
    ) -> None:
        super().__init__(interval, total_steps, background)
        self.loss, self.gym_id, self.gamma, self.logger = loss, gym_id, float(gamma), logger
        self.episodes, self.max_steps, self.seed = int(episodes), int(max_steps), int(seed)
        generator = torch.Generator().manual_seed(seed + 7)
        rows = torch.randperm(data.shape[0], generator=generator)[:num_states]
        self.batch = data[rows.to(data.device)].clone()
        self.task = task
        self.mc_start = start_states(data, mc_states, STATES_SEED) if task and mc_states else None

    # ------------------------------------------------------------- scheduling
    def measure(self, step: int) -> dict[str, float]:
        """All measurements at ``step``, in-line; logged under ``diag/`` and kept in
        ``history`` (after any still running in the background)."""
        self.drain()
        started = time.perf_counter()
        record = self._measure(step, self._horizons_at(step), self.loss)
        self._write(record, time.perf_counter() - started)
        return record

    def _in_line(self, step: int) -> None:
        """The measurement due at ``step``, in-line (:meth:`measure`)."""
        self.measure(step)

    def _job(self, step: int) -> Callable[[], tuple[dict[str, float], float]]:
        """Measures the LCB per horizon and copies the weights at ``step``; the job measures
        the rest on the copy and returns ``(record, seconds since the start)``."""
        started = time.perf_counter()
        horizons = self._horizons_at(step)
        model = self._snapshot()

        def run() -> tuple[dict[str, float], float]:
            return self._measure(step, horizons, model), time.perf_counter() - started

        return run

    def _write_result(self, result: tuple[dict[str, float], float]) -> None:
        """Writes a finished background measurement: ``(record, seconds)``."""
        self._write(*result)

    def _write(self, record: dict[str, float], seconds: float) -> None:
        """Keeps ``record`` in ``history`` and logs it under ``diag/`` with ``diag/seconds``."""
        self.history.append(record)
        scalars = {f"diag/{k}": v for k, v in record.items() if k != "step"}
        scalars["diag/seconds"] = seconds  # logged, not in the history
        log_scalars(self.logger, scalars, record["step"])

    def _snapshot(self) -> SimpleNamespace:
        """The parts of the loss a measurement reads, with the trained weights copied.

        The dynamics ensemble is shared: CBOP never changes it.
        """
        loss = self.loss
        with torch.no_grad():
            return SimpleNamespace(
                actor_network=copy.deepcopy(loss.actor_network),
                actor_network_params=loss.actor_network_params.detach().clone(),
                qvalue_network=copy.deepcopy(loss.qvalue_network),
                qvalue_network_params=loss.qvalue_network_params.detach().clone(),
                log_alpha=loss.log_alpha.detach().clone(),
                min_log_alpha=getattr(loss, "min_log_alpha", None),
                max_log_alpha=getattr(loss, "max_log_alpha", None),
                value_estimator=loss.value_estimator,
            )

    # ------------------------------------------------------------- measurements
    @torch.no_grad()
    def _horizons_at(self, step: int) -> dict[str, float]:
        """The LCB per horizon at ``step``: the one part drawing from the global stream
        (the estimator's rollout), seeded and forked so training's draws are unchanged."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed + step)
            return self._horizons()

    @torch.no_grad()
    def _measure(self, step: int, horizons: dict[str, float], model: Any) -> dict[str, float]:
        """Every measurement but the horizons' of ``model`` (the loss or a snapshot of it)."""
        generator = torch.Generator(device=self.batch.device).manual_seed(self.seed + step)
        record: dict[str, float] = {"step": step}
        record.update(self._policy_drift(model, generator))
        transitions = self._real_episodes(model)
        record.update(self._value_error(model, transitions))
        record.update(self._model_error(transitions))
        record.update(horizons)
        record.update(self._dataset_conservatism(model, generator))
        return record

    @staticmethod
    def _actor_call(model: Any, obs: torch.Tensor) -> TensorDictBase:
        """The deterministic policy's ``action`` (whatever the global exploration type)."""
        actor = model.actor_network
        with model.actor_network_params.to_module(actor):
            td = TensorDict({"observation": obs}, batch_size=obs.shape[:1])
            return DeterministicPolicy(actor)(td)

    @staticmethod
    def _q(model: Any, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Online Q-ensemble ``[N, O], [N, A] -> [M, N]``."""
        td = TensorDict({"observation": obs, "action": action}, batch_size=obs.shape[:1])
        q = ensemble_q(model.qvalue_network, model.qvalue_network_params, td)
        return q.squeeze(-1)

    def _policy_drift(self, model: Any, generator: torch.Generator) -> dict[str, float]:
        obs, data_action = self.batch.get("observation"), self.batch.get("action")
        policy_action = self._actor_call(model, obs).get("action")
        q_data, q_pi = self._q(model, obs, data_action), self._q(model, obs, policy_action)
        uniform = torch.rand(data_action.shape, generator=generator, device=data_action.device).to(
            data_action.dtype
        )
        q_uniform = self._q(model, obs, uniform * 2 - 1)
        actor = model.actor_network
        with model.actor_network_params.to_module(actor):
            dist = actor.get_dist(TensorDict({"observation": obs}, batch_size=obs.shape[:1]))
            inside = data_action.clamp(-1 + LOGGED_ACTION_EPS, 1 - LOGGED_ACTION_EPS)
            log_prob = dist.log_prob(inside)
        return {
            "q_data": float(q_data.mean()),
            "q_pi": float(q_pi.mean()),
            "q_pi_minus_data": float((q_pi - q_data).mean()),
            "q_std_data": float(q_data.std(0, unbiased=False).mean()),
            "q_std_pi": float(q_pi.std(0, unbiased=False).mean()),
            "q_uniform_minus_data": float((q_uniform - q_data).mean()),
            "q_std_uniform": float(q_uniform.std(0, unbiased=False).mean()),
            "bc_logprob": float(log_prob.mean()),
            "action_distance": float((policy_action - data_action).norm(dim=-1).mean()),
        }

    def _real_episodes(self, model: Any) -> dict[str, torch.Tensor]:
        """Deterministic episodes in the real env: transitions and their return-to-go."""
        obs_list, action_list, next_obs_list, reward_list, togo_list, start_list = (
            [], [], [], [], [], []
        )  # fmt: skip
        complete_list = []
        device = self.batch.device
        for episode in range(self.episodes):
            env = gymnasium.make(self.gym_id)
            observation, _ = env.reset(seed=self.seed + 1000 + episode)
            obs, actions, next_obs, rewards = [], [], [], []
            terminated = False
            for _ in range(self.max_steps):
                obs_t = torch.as_tensor(observation, dtype=torch.float32, device=device)
                action = self._actor_call(model, obs_t.unsqueeze(0)).get("action")[0]
                observation, reward, terminated, truncated, _ = env.step(
                    action.cpu().double().numpy()
                )
                obs.append(obs_t)
                actions.append(action)
                next_obs.append(torch.as_tensor(observation, dtype=torch.float32, device=device))
                rewards.append(float(reward))
                if terminated or truncated:
                    break
            env.close()
            length = len(rewards)
            togo = np.zeros(length)
            running = 0.0
            for t in reversed(range(length)):
                running = rewards[t] + self.gamma * running
                togo[t] = running
            complete = np.ones(length, dtype=bool)
            if not terminated:
                complete[max(0, length - MC_TAIL) :] = False
            obs_list += obs
            action_list += actions
            next_obs_list += next_obs
            reward_list += rewards
            togo_list.append(torch.as_tensor(togo, dtype=torch.float32))
            complete_list.append(torch.as_tensor(complete))
            start = torch.zeros(length, dtype=torch.bool)
            start[0] = True
            start_list.append(start)
        return {
            "obs": torch.stack(obs_list),
            "action": torch.stack(action_list),
            "next_obs": torch.stack(next_obs_list),
            "reward": torch.tensor(reward_list, dtype=torch.float32, device=device),
            "togo": torch.cat(togo_list).to(device),
            "complete": torch.cat(complete_list).to(device),
            "start": torch.cat(start_list).to(device),
        }

    def _value_error(self, model: Any, transitions: dict[str, torch.Tensor]) -> dict[str, float]:
        q = self._q(model, transitions["obs"], transitions["action"]).mean(0)
        complete, start = transitions["complete"], transitions["start"]
        togo = transitions["togo"]
        lengths = start.nonzero().squeeze(-1).tolist() + [start.numel()]
        bounds = zip(lengths[:-1], lengths[1:], strict=True)
        returns = [float(transitions["reward"][a:b].sum()) for a, b in bounds]
        return {
            "episode_return": float(np.mean(returns)),
            "episode_length": float(np.mean(np.diff(lengths))),
            "q_start": float(q[start].mean()),
            "mc_start": float(togo[start].mean()),
            "q_visited": float(q[complete].mean()) if complete.any() else float("nan"),
            "mc_visited": float(togo[complete].mean()) if complete.any() else float("nan"),
            "q_minus_mc_visited": float((q - togo)[complete].mean())
            if complete.any()
            else float("nan"),
        }

    def _dataset_conservatism(self, model: Any, generator: torch.Generator) -> dict[str, float]:
        if self.mc_start is None:
            return {}
        numbers = dataset_conservatism(
            model, self.task, self.mc_start, self.gamma, alpha=soft_critic_alpha(model),
            max_steps=self.max_steps, generator=generator,
        )  # fmt: skip
        return {
            "q_minus_mc_data": numbers["overestimation"],
            "q_minus_mc_data_no_entropy": numbers["overestimation_no_entropy"],
            "entropy_part_data": numbers["entropy_part_mean"],
            "q_data_states": numbers["predicted_q_mean"],
            "mc_data_states": numbers["mc_return_mean"],
        }

    def _one_step_error(
        self, obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor, reward: torch.Tensor
    ) -> tuple[float, float, float]:
        """Elites' mean-prediction error (standardized MSE, reward part) and disagreement."""
        dynamics = self.loss.value_estimator.dynamics
        ensemble = dynamics.ensemble
        mean, _ = ensemble.predict(obs, action, dynamics.elite_indices, per_member=False)
        target = torch.cat([next_obs - obs, reward.reshape(-1, 1)], dim=-1)
        scale = ensemble.target_std
        error = ((mean.mean(0) - target) / scale).pow(2)
        disagreement = (mean / scale).var(0, unbiased=False).mean()
        return float(error.mean()), float(error[:, -1].mean()), float(disagreement)

    def _model_error(self, transitions: dict[str, torch.Tensor]) -> dict[str, float]:
        policy = self._one_step_error(
            transitions["obs"],
            transitions["action"],
            transitions["next_obs"],
            transitions["reward"],
        )
        batch = self.batch
        data = self._one_step_error(
            batch.get("observation"),
            batch.get("action"),
            batch.get(("next", "observation")),
            batch.get(("next", "reward")),
        )
        return {
            "model_error_policy": policy[0],
            "model_reward_error_policy": policy[1],
            "model_disagreement_policy": policy[2],
            "model_error_data": data[0],
            "model_reward_error_data": data[1],
            "model_disagreement_data": data[2],
        }

    def _horizons(self) -> dict[str, float]:
        estimator = self.loss.value_estimator
        next_obs = self.batch.get(("next", "observation"))
        returns, valid, _ = estimator.rollout_returns(next_obs)
        post = gaussian_posterior(returns, valid, estimator.var_floor, estimator.unbiased_variance)
        record: dict[str, float] = {
            "posterior_std": float(post.var.sqrt().mean()),
            "lcb_penalty": float(estimator.psi * post.var.sqrt().mean()),
        }
        mu_0 = post.mu_h[:, 0]
        for h in range(returns.shape[1]):
            record[f"horizon_gap_{h}"] = float((post.mu_h[:, h] - mu_0).mean())
            record[f"horizon_std_{h}"] = float(post.var_h[:, h].sqrt().mean())
            record[f"horizon_weight_{h}"] = float(post.weights[:, h].mean())
        return record
