"""Batteries of refused commands, one test file per program (tests/test_refusals_cbop_*.py).

Each case runs the program's entry point in this process (tests/inprocess.py: the same
``cbop_torchrl.apps.<name>.main()`` behind the same Hydra command line), each from its own
empty working folder with an environment of its own, so a refused command is also checked
to leave nothing behind. A case that would block (a FIFO opened for reading) fails under an
alarm instead of hanging the worker. What only a fresh process shows (the interpreter's
exit code of ``scripts/*.py``, Ctrl-C) is tested with real subprocesses in those files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from inprocess import Finished, run_program
from programs import _clear_hydra, _forget_programs, logging_restored

#: A child process's imports on a loaded 2-core machine; every refusal comes before training.
TIMEOUT_S = 120
APPS = "cbop_torchrl.apps."  # the programs' modules, imported anew for each run
BLOCKED_AFTER_S = 120  # far above what a refusal takes on a loaded machine; a FIFO blocks
#: What a refusal's output never holds, whatever the case (a traceback, Hydra's own advice
#: or its error wrapper, a stage that started).
NOISE = ("Traceback", "HYDRA_FULL_ERROR", "Error executing job", "[cbop] dynamics")
#: OmegaConf's error fields, in no message of a refused value or type. (An interpolation of
#: the key itself, ``seed=${seed}``, is followed by Hydra's warning from a callback that
#: names them; those cases do not check these words.)
OMEGACONF_FIELDS = ["object_type", "full_key"]


@dataclass
class Case:
    """One refused command: its script, arguments, the words its error must hold and must
    not hold, and the files it must leave as they were.

    ``in_error_line``: the words are in the ``error:`` line itself (a one-line message),
    not only somewhere in the paragraph from it on. ``env``: variables set for this case
    only, over :func:`case_env`.
    """

    script: str
    args: list[str]
    words: list[str]
    not_words: list[str] = field(default_factory=list)
    kept: dict[Path, bytes] = field(default_factory=dict)
    absent: list[Path] = field(default_factory=list)
    in_error_line: bool = False
    env: dict[str, str] = field(default_factory=dict)


def case_env(cwd: Path, home: Path | None = None) -> dict[str, str]:
    """This process's environment with a cache in ``cwd``, no GPU and no ``HYDRA_FULL_ERROR``."""
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(cwd / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    if home is not None:
        env["HOME"] = str(home)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


@contextlib.contextmanager
def no_blocking(seconds: int = BLOCKED_AFTER_S) -> Iterator[None]:
    """Raises TimeoutError in the block after ``seconds`` (a FIFO opened for reading)."""

    def blocked(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a special file was opened")

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def working_folder(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """``cwd`` as the working directory and ``env`` as the whole environment, inside."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def run_one(script: str, args: list[str], cwd: Path, env: dict[str, str]) -> Finished:
    """``python scripts/<script> *args`` from ``cwd`` with ``env``, run in this process as a
    new process would start it: no Hydra instance and the program's module imported anew."""
    programs = {name: module for name, module in sys.modules.items() if name.startswith(APPS)}
    _clear_hydra()
    _forget_programs()
    try:
        with working_folder(cwd, env), logging_restored(), no_blocking():
            return run_program(script.removesuffix(".py"), args)
    finally:
        _clear_hydra()
        # the modules other tests imported, back in place (not the run's fresh copies)
        _forget_programs()
        sys.modules.update(programs)
        for name, module in programs.items():
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, module)


def evaluate_in(folder: Path, monkeypatch, *argv: str) -> int:  # noqa: ANN001 (pytest.MonkeyPatch)
    """``cbop-evaluate *argv`` from ``folder`` through its entry point, in this process; the
    exit code (its output goes to pytest's capture)."""
    from cbop_torchrl.apps import evaluate
    from cbop_torchrl.cli import run_entry

    monkeypatch.chdir(folder)
    return run_entry(evaluate.main, list(argv))


def run_cases(cases: dict[str, Case], root: Path) -> dict[str, tuple[Finished, Path, Case]]:
    """Runs every case, each in its own empty working folder under ``root``:
    case id -> (what it did, its folder, the case)."""
    done = {}
    for index, (id_, case) in enumerate(cases.items()):
        cwd = root / f"work{index}"
        cwd.mkdir()
        done[id_] = run_one(case.script, case.args, cwd, {**case_env(cwd), **case.env}), cwd, case
    return done


def assert_refused(done: Finished, cwd: Path, case: Case) -> None:
    """Exit 2 and one ``error:`` paragraph holding the case's words, no noise, nothing left in
    ``cwd`` but its cache, no stage cached, the kept files as they were, the absent ones absent."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    for noise in (*NOISE, *case.not_words):
        assert noise not in output, (noise, output)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    message = errors[0] if case.in_error_line else done.stderr[done.stderr.index("error:") :]
    for word in case.words:
        assert word in message, (word, message)
    left = sorted(p.name for p in cwd.iterdir() if p.name != "cache")
    assert left == [], f"the refused command left {left} behind"
    assert not (cwd / "cache" / "dynamics").exists(), "a stage ran before the refusal"
    for path, content in case.kept.items():
        assert path.read_bytes() == content, path
        assert not path.is_symlink()
    for path in case.absent:
        assert not path.exists(), path


def selected_cases(request, test_name: str, cases: dict[str, Case]) -> dict[str, Case]:  # noqa: ANN001
    """The cases of ``test_name`` (parametrized by case id) this session runs, so ``-k`` on
    one case does not pay for all of them."""
    from programs import selected_ids

    wanted = selected_ids(request, test_name)
    return {id_: case for id_, case in cases.items() if id_ in wanted}


def case_ids(make_cases) -> list[str]:  # noqa: ANN001 (root -> dict[str, Case])
    """The ids of the cases ``make_cases`` builds (in a throw-away folder)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return list(make_cases(Path(folder)))
