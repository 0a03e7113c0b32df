"""What moves the BC actor off the data in CBOP's first steps? (docs/learning.md, Experiment 12)

    python benchmarks/actor_objective_probe.py env=PATH_OR_ID seed=0 [other cbop overrides]

Builds the run's dynamics ensemble, BC actor and FQE critic as ``scripts/cbop.py``
would with the same overrides (cached stages are reused), then trains copies of the
BC actor for 100 steps against the *frozen* FQE critic, one actor objective each
(fresh Adam at the preset's actor lr, the preset's batch): BC's own loss (control),
SAC's ``alpha log pi - min_m Q_m`` with alpha = 1 (CBOP's start), ``-min Q`` alone,
``alpha log pi`` alone, SAC's after 500 BC steps that warm Adam's moments, and SAC's
with plain SGD. Prints, at steps 0/10/20/50/100, the score (10 deterministic
episodes), the deterministic action's distance to the data's, log pi(a_data|s), min Q
at the policy's action minus at the data's, and the mean pre-tanh scale; first the
norms and cosine of the entropy and min-Q parts of the actor's gradient at the BC actor.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.apps.api import compose_config
from cbop_torchrl.cli import config_values
from cbop_torchrl.config import load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.envs import evaluate_policy, make_eval_env
from cbop_torchrl.objectives.pretrain import ensemble_q
from cbop_torchrl.runtime import seed_everything
from cbop_torchrl.trainers.offline import (
    OfflineRun,
    behaviour_cloning_stage,
    build_cbop_loss,
    dynamics_stage,
    fitted_q_evaluation_stage,
)

LOG_AT = (0, 10, 20, 50, 100)
EDGE = 1 - 1e-4  # log pi is infinite on the box's edges, where data actions may sit


def main(overrides: list[str]) -> None:
    loaded: dict = {}

    def lookup(env: str) -> tuple[str | None, str]:
        loaded["data"], loaded["info"] = load_dataset_with_info(env)
        return loaded["info"].family, loaded["info"].name

    config, _ = load_config(config_values(compose_config(["progress=false", *overrides])), lookup)
    info = loaded["info"]
    run = OfflineRun.open(config, info, Path(tempfile.mkdtemp()), config.training_dict())
    data = run.specs.to_agent_actions(loaded["data"])
    seed_everything(config.seed)
    dynamics, _ = dynamics_stage(run, data)
    bc_state, _ = behaviour_cloning_stage(run, data)
    fqe_state, _ = fitted_q_evaluation_stage(run, data)
    loss, bc_actor = build_cbop_loss(config, info, dynamics, run.device)
    bc_actor.load_state_dict(bc_state)
    loss.load_state_dict(fqe_state, strict=False)
    q_params = loss.qvalue_network_params.detach()
    eval_env = make_eval_env(run.task, 10, "serial")
    batch, lr = config.train.batch_size, config.agent.actor_lr

    def min_q(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[N, O], [N, A] -> [N]``: the frozen critic's minimum over members."""
        td = TensorDict({"observation": obs, "action": action}, batch_size=obs.shape[:1])
        return ensemble_q(loss.qvalue_network, q_params, td).squeeze(-1).min(0).values

    def objective(kind: str, actor, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        dist = actor.get_dist(TensorDict({"observation": obs}, batch_size=obs.shape[:1]))
        if kind == "bc":
            return -dist.log_prob(action.clamp(-EDGE, EDGE)).mean()
        sample = dist.rsample()
        log_pi = dist.log_prob(sample)
        if kind == "entropy":
            return log_pi.mean()
        if kind == "min-q":
            return -min_q(obs, sample).mean()
        return (log_pi - min_q(obs, sample)).mean()

    generator = torch.Generator().manual_seed(config.seed)
    rows = torch.randint(data.shape[0], (4096,), generator=generator)
    probe_obs, probe_action = data["observation"][rows], data["action"][rows]

    def measure(actor) -> str:
        td = TensorDict({"observation": probe_obs}, batch_size=probe_obs.shape[:1])
        with torch.no_grad():
            with set_exploration_type(ExplorationType.DETERMINISTIC):
                action = actor(td.clone())["action"]
            log_prob = actor.get_dist(td.clone()).log_prob(probe_action.clamp(-EDGE, EDGE))
            scale = actor.module[0](td.clone())["scale"].mean()
            gap = (min_q(probe_obs, action) - min_q(probe_obs, probe_action)).mean()
            result = evaluate_policy(actor, run.task, eval_env, config.eval.max_steps, config.seed)
        score = sum(result.normalized_scores) / len(result.normalized_scores)
        distance = (action - probe_action).norm(dim=-1).mean()
        return (f"score {score:5.1f}  distance {distance:.3f}  log pi(a_data) "
                f"{float(log_prob.mean()):9.2f}  minQ(pi)-minQ(data) {float(gap):5.2f}  "
                f"scale {float(scale):.3f}")  # fmt: skip

    def train(name: str, kind: str, actor, optimizer, steps: int = 100, log_at=LOG_AT) -> None:
        for step in range(steps + 1):
            if step in log_at:
                print(f"[{name}] {step:4d} {measure(actor)}", flush=True)
            if step == steps:
                return
            idx = torch.randint(data.shape[0], (batch,))
            value = objective(kind, actor, data["observation"][idx], data["action"][idx])
            optimizer.zero_grad()
            value.backward()
            optimizer.step()

    torch.manual_seed(config.seed)
    obs = data["observation"][torch.randint(data.shape[0], (4096,))]
    parts = {}
    for kind in ("entropy", "min-q"):
        actor = copy.deepcopy(bc_actor)
        torch.manual_seed(config.seed)
        objective(kind, actor, obs, obs[:, :0]).backward()
        parts[kind] = torch.cat([p.grad.flatten() for p in actor.parameters()])
    cosine = torch.nn.functional.cosine_similarity(parts["entropy"], parts["min-q"], 0)
    print(f"[gradient at the BC actor] |entropy part| {parts['entropy'].norm():.3f}  "
          f"|min-Q part| {parts['min-q'].norm():.3f}  cosine {cosine:.3f}")  # fmt: skip

    fresh: Callable = lambda actor: torch.optim.Adam(actor.parameters(), lr=lr)  # noqa: E731
    for name, kind in (("bc (control)", "bc"), ("sac", "sac"), ("min-q only", "min-q"),
                       ("entropy only", "entropy")):  # fmt: skip
        torch.manual_seed(config.seed)
        actor = copy.deepcopy(bc_actor)
        train(name, kind, actor, fresh(actor))
    torch.manual_seed(config.seed)
    actor = copy.deepcopy(bc_actor)
    optimizer = fresh(actor)
    train("bc, warming Adam", "bc", actor, optimizer, steps=500, log_at=(500,))
    train("sac after warm Adam", "sac", actor, optimizer)
    torch.manual_seed(config.seed)
    actor = copy.deepcopy(bc_actor)
    train("sac, SGD lr 1e-3", "sac", actor, torch.optim.SGD(actor.parameters(), lr=1e-3))
    eval_env.close()


if __name__ == "__main__":
    main(sys.argv[1:])
