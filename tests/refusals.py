"""Batteries of refused commands: each case runs the real program, all of them in one child
process (tests/programs.py), each from its own empty working folder."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from programs import Call, run_programs

TIMEOUT_S = 120  # imports on a loaded 2-core machine; every refusal comes before training


@dataclass
class Case:
    """One refused command: its script, arguments, the words its error must hold and must
    not hold, and the files it must leave as they were."""

    script: str
    args: list[str]
    words: list[str]
    not_words: list[str] = field(default_factory=list)
    kept: dict[Path, bytes] = field(default_factory=dict)
    absent: list[Path] = field(default_factory=list)


def case_env(cwd: Path, home: Path | None = None) -> dict[str, str]:
    """This process's environment with a cache in ``cwd``, no GPU and no ``HYDRA_FULL_ERROR``."""
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(cwd / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    if home is not None:
        env["HOME"] = str(home)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def run_cases(
    cases: dict[str, Case], root: Path
) -> dict[str, tuple[subprocess.CompletedProcess, Path, Case]]:
    """Runs every case in one child process, each in its own empty working folder under
    ``root``: case id -> (what it did, its folder, the case)."""
    calls, folders = [], {}
    for index, (id_, case) in enumerate(cases.items()):
        cwd = root / f"work{index}"
        cwd.mkdir()
        folders[id_] = cwd
        calls.append(Call(case.script, case.args, str(cwd), case_env(cwd)))
    results = run_programs(calls, timeout_s=TIMEOUT_S + 30 * len(calls))
    return {
        id_: (done, folders[id_], case)
        for (id_, case), done in zip(cases.items(), results, strict=True)
    }
