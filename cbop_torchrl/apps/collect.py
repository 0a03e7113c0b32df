"""``cbop-collect`` (``scripts/collect.py``): generate D4RL-recipe datasets on gymnasium
MuJoCo ``*-v4`` (see configs/collect.yaml).

    cbop-collect env=hopper kind=medium-replay seed=0
    cbop-collect env=walker2d kind=[medium,medium-replay]
    cbop-collect env=halfcheetah kind=all sac.total_steps=1000000

Rerunning a killed command resumes it: the SAC run continues from its last
checkpoint and files already written with the same settings are kept.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from cbop_torchrl.cli import check_cache_writable, check_output_writable, hydra_entry, refuse
from cbop_torchrl.data.collect_env import filter_env_warnings
from cbop_torchrl.data.collect_sac import SACConfig
from cbop_torchrl.data.generate import GenerationRequest, generate_datasets
from cbop_torchrl.envs.task import TaskError, collection_task
from cbop_torchrl.io import cache_dir
from cbop_torchrl.registry import D4RL_KINDS


def parse_kinds(kind: str | ListConfig) -> list[str]:
    """``"medium"``, ``[medium, medium-replay]`` or ``"all"`` -> a list of kinds."""
    if isinstance(kind, ListConfig | list | tuple):
        return [str(k) for k in kind]
    return list(D4RL_KINDS) if kind == "all" else [str(kind)]


def build_request(cfg: DictConfig, command: str) -> GenerationRequest:
    """The generation request described by the Hydra config (raises ValueError/KeyError)."""
    sac = OmegaConf.to_container(cfg.sac)
    sac["hidden_sizes"] = tuple(sac["hidden_sizes"])
    return GenerationRequest(
        family=collection_task(str(cfg.env), OmegaConf.to_container(cfg.task, resolve=True)),
        kinds=parse_kinds(cfg.kind),
        seed=int(cfg.seed),
        sac=SACConfig(**sac),
        medium_fraction=float(cfg.medium_fraction),
        medium_reference=str(cfg.medium_reference),
        medium_min_normalized=None
        if cfg.medium_min_normalized is None
        else float(cfg.medium_min_normalized),
        stop_at_medium=bool(cfg.stop_at_medium),
        rollout_transitions=int(cfg.rollout_transitions),
        rollout_exploration=str(cfg.rollout_exploration),
        tag=cfg.tag,
        out_dir=Path(cfg.out_dir) if cfg.out_dir else cache_dir("generated"),
        runs_dir=Path(cfg.runs_dir) if cfg.runs_dir else cache_dir("collect_runs"),
        compression=None if cfg.compression is None else str(cfg.compression),
        compression_level=int(cfg.compression_level),
        command=command,
        progress=bool(cfg.progress),
    )


def command_line(argv: list[str]) -> str:
    """The command as typed, for the files' provenance: ``python scripts/collect.py ...`` or
    ``cbop-collect ...``."""
    program = Path(argv[0])
    words = ["python", f"scripts/{program.name}"] if program.suffix == ".py" else [program.name]
    return shlex.join([*words, *argv[1:]])


def checked_request(cfg: DictConfig) -> GenerationRequest:
    """The request of ``cfg``, every setting and output folder checked; refuses (exit 2)
    one that cannot run."""
    if cfg.out_dir is None or cfg.runs_dir is None:  # their default is under the cache
        check_cache_writable()
    for key in ("out_dir", "runs_dir"):
        if cfg[key] is not None:
            check_output_writable(key, cfg[key])
    try:
        request = build_request(cfg, command_line(sys.argv))
        request.validate()
    except (TaskError, ValueError, KeyError) as error:
        refuse(error.args[0] if isinstance(error, KeyError) and error.args else error)
    return request


def validate(cfg: DictConfig) -> None:
    """The whole config checked before any collection (:func:`checked_request`)."""
    checked_request(cfg)


def run(cfg: DictConfig) -> None:
    """The Hydra task: generate the requested files and print their paths."""
    filter_env_warnings()
    torch.set_num_threads(int(cfg.num_threads))
    request = checked_request(cfg)
    try:
        paths = generate_datasets(request)
    except (TaskError, ValueError, KeyError) as error:
        refuse(error.args[0] if isinstance(error, KeyError) and error.args else error)
    for path in paths:
        print(path)


def main() -> None:
    hydra_entry("collect", validate=validate)(run)()
