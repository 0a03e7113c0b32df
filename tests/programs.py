"""Many runs of the ``scripts/*.py`` programs in one child process, and logging isolation.

A refused command costs ~1 s of work but ~6-7 s of process start (torch, TorchRL and
Hydra imports) and exit; :func:`run_programs` pays that once for a whole list of calls.
Each call still runs as a program, not as a function called by pytest: the child
executes ``scripts/<name>.py`` as ``__main__`` with the call's ``sys.argv``, working
directory and environment, captures file descriptors 1 and 2 (so ``print``, logging
handlers and anything else writing there is caught, and neither is a terminal), records
the ``SystemExit`` code (an uncaught exception: its traceback on stderr and code 1, as
Python does), and between calls puts back what a call may change: the working
directory, ``os.environ``, ``sys.argv``/``sys.stdout``/``sys.stderr``, the warnings
filters (``warnings.catch_warnings()``), the logging configuration
(:func:`logging_restored`) and Hydra's global state; each call imports its program's
module (``cbop_torchrl.apps.<name>``) again, so state its ``main`` keeps is new too.

What a fresh process alone shows is tested with real subprocesses (Ctrl-C and exit code
130, a terminal, the interpreter's own exit code of ``scripts/*.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


@dataclass(frozen=True)
class Call:
    """One command line: ``python scripts/<script> *args`` in ``cwd`` with ``env``.

    ``env``: the whole environment of the call; None is the test process's own.
    """

    script: str
    args: Sequence[str]
    cwd: str | Path
    env: dict[str, str] | None = field(default=None)


def run_programs(
    calls: Sequence[Call], timeout_s: float = 600.0
) -> list[subprocess.CompletedProcess]:
    """Runs ``calls`` one after another in one child process; one result per call, in order.

    Each result's ``args`` is the command line the call stands for and ``returncode``,
    ``stdout`` and ``stderr`` are what that command would have given as a process of
    its own. Raises RuntimeError (with the child's output) when the child itself fails.
    """
    plain = [
        {
            **asdict(call),
            "args": [str(a) for a in call.args],
            "cwd": str(call.cwd),
            "env": dict(os.environ if call.env is None else call.env),
        }
        for call in calls
    ]
    with tempfile.TemporaryDirectory(prefix="programs_") as folder:
        given, results = Path(folder) / "calls.json", Path(folder) / "results.json"
        given.write_text(json.dumps(plain))
        child = subprocess.run(
            [sys.executable, __file__, str(given), str(results)],
            capture_output=True, text=True,
            timeout=timeout_s, cwd=folder,
        )  # fmt: skip
        if child.returncode != 0 or not results.exists():
            raise RuntimeError(
                f"the child running {len(calls)} programs exited with {child.returncode}:\n"
                f"{child.stdout}\n{child.stderr}"
            )
        done = json.loads(results.read_text())
    return [
        subprocess.CompletedProcess(
            [sys.executable, str(SCRIPTS / call.script), *call.args],
            result["returncode"],
            result["stdout"],
            result["stderr"],
        )  # fmt: skip
        for call, result in zip(calls, done, strict=True)
    ]


def selected_ids(request, test_name: str) -> set[str]:  # noqa: ANN001 (pytest's FixtureRequest)
    """The parametrize ids of ``test_name`` (in the requesting module) this session runs.

    A module fixture that runs every case of a file in one child runs only these, so
    ``-k`` on one case does not pay for all of them.
    """
    return {
        item.callspec.id
        for item in request.session.items
        if getattr(item, "originalname", None) == test_name
        and getattr(item, "module", None) is request.module
        and hasattr(item, "callspec")
    }


# ------------------------------------------------------------------------------ logging


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """Puts back the handlers, levels and switches of every logger that existed before.

    Hydra configures logging for each run (``StreamHandler``\\ s on ``sys.stdout`` or
    ``sys.stderr`` as they are at that moment, a pytest capture stream in a test); a
    handler left on the root logger would write the next run's records to that stream
    after it was closed. Handlers added meanwhile are closed (a ``FileHandler``'s file;
    a stream handler leaves its stream open). Loggers first made meanwhile (by an import)
    keep what they have.
    """
    manager = logging.Logger.manager
    loggers = [logging.root] + [
        logger for logger in manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    saved = [
        (logger, list(logger.handlers), logger.level, logger.propagate, logger.disabled)
        for logger in loggers
    ]
    disabled = manager.disable
    try:
        yield
    finally:
        kept = {id(handler) for _, handlers, *_ in saved for handler in handlers}
        # A logger first made meanwhile (torch's compile loggers, by a lazy import) keeps its
        # handlers, but not a stream handler on this test's capture stream, which pytest
        # closes: a later test's record or flush on it raises "I/O operation on closed file".
        real_streams = (sys.__stdout__, sys.__stderr__)
        for logger in [logging.root, *manager.loggerDict.values()]:
            if isinstance(logger, logging.Logger) and logger not in loggers:
                for handler in list(logger.handlers):
                    if (type(handler) is logging.StreamHandler
                            and handler.stream not in real_streams):  # fmt: skip
                        logger.removeHandler(handler)
        for logger, handlers, level, propagate, was_disabled in saved:
            for handler in logger.handlers:
                if id(handler) not in kept:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
            logger.disabled = was_disabled
        logging.disable(disabled)


def absl_logs_to_the_process_stderr() -> None:
    """Points absl's Python log handler at ``sys.__stderr__``, so no handler owns a pytest
    capture stream.

    ``absl.logging`` (imported by tensorboard and rliable) makes one handler at import,
    writing to ``sys.stderr`` as it is then: in a test, pytest's capture file. Any
    ``logging.config.dictConfig`` (Hydra's, for a program run in-process) closes every live
    handler, and absl's ``close`` closes its stream unless it is the current
    ``sys.stdout``/``sys.stderr``; while a program runs with its streams sent elsewhere,
    that is the worker's capture file, and every later test of the worker then errors with
    "I/O operation on closed file" at setup. File descriptor 2 is still captured.
    """
    try:
        import absl.logging
    except ImportError:
        return
    absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


# -------------------------------------------------------------------------- the child


def _run_one(call: dict) -> dict:
    """Runs one call in this process with file descriptors 1 and 2 sent to files."""
    import runpy
    import traceback
    import warnings

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams = sys.stdout, sys.stderr
    _clear_hydra()
    _forget_programs()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            os.environ.clear()
            os.environ.update(call["env"])
            os.chdir(call["cwd"])
            script = str(SCRIPTS / call["script"])
            sys.argv = [script, *call["args"]]
            warnings.onceregistry.clear()
            with logging_restored(), warnings.catch_warnings():
                try:
                    runpy.run_path(script, run_name="__main__")
                    code = 0
                except SystemExit as exit_:
                    code = _exit_code(exit_.code)
                except BaseException:  # as the interpreter reports an uncaught exception
                    traceback.print_exc()
                    code = 1
                finally:
                    for stream in (sys.stdout, sys.stderr, *saved_streams):
                        with contextlib.suppress(Exception):
                            stream.flush()
        finally:
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            sys.argv = saved_argv
            _clear_hydra()
        texts = []
        for file in (out, err):
            file.seek(0)
            texts.append(file.read().decode(errors="replace"))
    return {"returncode": code, "stdout": texts[0], "stderr": texts[1]}


def _exit_code(code: object) -> int:
    """The process exit code ``sys.exit(code)`` gives (a message: printed, and 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _forget_programs() -> None:
    """Makes the next call import its program module again, as a new process would.

    A program's ``main`` keeps state from its run (``hydra_entry``: whether its task
    started, the ``HYDRA_FULL_ERROR`` it found at import); the modules it imports stay.
    """
    for name in [name for name in sys.modules if name.startswith("cbop_torchrl.apps.")]:
        del sys.modules[name]


def _clear_hydra() -> None:
    """Forgets the previous run's Hydra instance and its ``HydraConfig`` (as a new process)."""
    if "hydra" not in sys.modules:
        return
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None


def _child_main(given: str, results: str) -> int:
    sys.path[0] = str(SCRIPTS)  # what `python scripts/<name>.py` puts first, not tests/
    calls = json.loads(Path(given).read_text())
    Path(results).write_text(json.dumps([_run_one(call) for call in calls]))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(*sys.argv[1:]))
