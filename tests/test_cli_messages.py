"""What every program prints for an interrupt, a log file and ``--help``.

Ctrl-C exits with 130 and says how to go on; redirected to a file, a run writes a few whole
lines per progress bar instead of thousands of fragments; each program's help says what it
does. Each program's refusals of bad input are in tests/test_refusals_cbop_*.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from programs import logging_restored

from cbop_torchrl.config import capped_threads, generated_psi, usable_cores
from cbop_torchrl.trainers.logging import ProgressLines

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CBOP_TORCHRL_CACHE": str(tmp_path / "cache")}


def test_ctrl_c_exits_130_with_how_to_resume_and_no_traceback(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "scripts" / "cbop.py"), "preset=debug",
               "train.epochs=500", "eval.interval=0", "logger=none"]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        # A test run started in the background (cmd &) ignores SIGINT, and so would the child.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    lines = []
    for line in process.stdout:  # wait until the CBOP stage's Trainer runs (its bar's first line)
        lines.append(line)
        if "| 0/10000 " in line:
            break
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "interrupted; resume with the same command" in output
    assert "preset=debug train.epochs=500" in output  # the command to run again


def test_a_run_logged_to_a_file_writes_a_few_lines_per_progress_bar(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cbop.py"), "preset=debug", "logger=none"],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\r" not in done.stderr  # whole lines, not redraws
    bars = [line for line in done.stderr.splitlines() if "%|" in line]
    names = {line.split("%|")[0].rsplit(":", 1)[0].split(":")[0].strip() for line in bars}
    assert {"dynamics", "bc", "fqe"} <= names  # a fresh cache: every stage trains
    assert len(bars) <= 3 * 4  # four stages (dynamics, BC, FQE, CBOP): first and last lines
    assert not list((tmp_path / "runs").rglob("*.log"))  # no empty cbop.log: the run prints
    # No warning of any kind (TorchRL's target-updater notice included: tests/test_warnings.py).
    assert "Warning" not in done.stdout + done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # The banner comes first: the run directory and each stage's settings.
    first = done.stdout.splitlines()[:8]
    assert "run directory runs/" in first[0]
    for stage in ("dynamics:", "bc:", "fqe:", "cbop:", "eval:"):
        assert any(f"[cbop]   {stage}" in line for line in first), first
    psi = generated_psi("hopper-demo-medium-replay-gen")  # the demo's set's offline choice
    assert any(f"psi={psi}" in line and "H=2" in line and "M=3" in line for line in first)
    for stage in ("dynamics", "bc", "fqe", "cbop", "eval"):  # once, in the banner
        lines = [line for line in done.stdout.splitlines() if line.split()[1:2] == [f"{stage}:"]]
        assert len(lines) == 1, done.stdout


def test_progress_lines_keep_a_bar_to_a_line_every_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    stream = ProgressLines(out, interval=30.0, clock=lambda: now[0])
    for percent in range(0, 101):  # 100 redraws over 200 s
        stream.write(f"\rstage: {percent:3d}%|bar| {percent}/100")
        now[0] += 2.0
    stream.write("\n")  # tqdm closes the bar
    stream.write("after\n")
    lines = out.getvalue().splitlines()
    assert lines[0] == "stage:   0%|bar| 0/100"
    assert lines[-2] == "stage: 100%|bar| 100/100" and lines[-1] == "after"
    assert 3 <= len(lines) - 1 <= 2 + 200 // 30  # first, last, at most one per 30 s


def test_progress_lines_need_ten_points_between_lines() -> None:
    now = [0.0]
    out = io.StringIO()
    stream = ProgressLines(out, interval=30.0, clock=lambda: now[0])
    for percent in (0, 1, 2, 3):  # a slow bar: minutes per percent
        stream.write(f"\rslow: {percent}%|")
        now[0] += 100.0
    stream.close_bars()
    assert out.getvalue().splitlines() == ["slow: 0%|", "slow: 3%|"]


def test_threads_above_the_cores_are_capped_with_a_note() -> None:
    cores = usable_cores()
    assert capped_threads(None) == (None, None)
    assert capped_threads(cores) == (cores, None)
    capped, note = capped_threads(cores + 1000)
    assert capped == cores
    assert f"threads={cores + 1000}" in note and f"threads={cores}" in note


def test_a_wandb_project_name_wandb_refuses_is_refused_at_config_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cbop_torchrl.apps.api import compose_config
    from cbop_torchrl.cli import run_entry

    # The API composes the same config; the program refuses it before loading anything.
    assert compose_config(["logger=wandb", "logger.project=a/b"]).logger.project == "a/b"
    from cbop_torchrl.apps import cbop

    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = run_entry(cbop.main, ["preset=debug", "logger=wandb", "logger.project=a/b"])
    assert code == 2
    assert "logger.project='a/b' is not a wandb project name" in err.getvalue()
    assert not (tmp_path / "runs").exists()  # the refused run left nothing


#: Two tests of a session: the first configures logging on its capture stream as Hydra does
#: for a program run in-process, the second logs (as Hydra's launcher in a later ``-m`` run).
TWO_TESTS = """
import logging
import sys


def test_a_program_configures_logging(capsys):
    logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("hydra").info("configured")
    assert capsys.readouterr().err == "configured\\n"


def test_the_next_test_logs(capsys, caplog):
    logging.getLogger("hydra.launcher").warning("Launching 1 jobs locally")
    assert [r.getMessage() for r in caplog.records] == ["Launching 1 jobs locally"]
    error = capsys.readouterr().err
    assert error == "", error
"""


def test_a_logging_handler_an_earlier_test_set_up_does_not_reach_the_next_test(
    pytester: pytest.Pytester, request: pytest.FixtureRequest
) -> None:
    """The flake of a later ``-m`` report test: a Hydra handler on a closed capture stream."""
    pytester.makepyfile(test_two=TWO_TESTS)
    with logging_restored():  # the first session leaves its handler in this process
        without = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    without.assert_outcomes(passed=1, failed=1)
    without.stdout.fnmatch_lines(["*Logging error*", "*I/O operation on closed file*"])
    isolation = request.config.pluginmanager.get_plugin("cbop-logging-isolation")
    assert isolation is not None  # tests/conftest.py registers it for every test
    isolated = pytester.runpytest_inprocess("-p", "no:cacheprovider", plugins=[isolation])
    isolated.assert_outcomes(passed=2)


#: Two tests of a fresh session: the first imports absl (tensorboard and rliable do) and then
#: reconfigures logging with its streams sent elsewhere, as a program run in-process does.
ABSL_TESTS = """
import contextlib
import io
import logging.config


def test_a_program_reconfigures_logging_with_its_streams_elsewhere():
    import absl.logging  # noqa: F401 (its handler is made now, on this test's stderr)

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})


def test_the_next_test_is_captured():
    print("captured")
"""

ABSL_CONFTEST = """
import os
import sys

sys.path.insert(0, os.environ["CBOP_TESTS_DIR"])


def pytest_configure(config):
    if os.environ.get("CBOP_ABSL_FIX") == "1":
        from programs import absl_logs_to_the_process_stderr

        absl_logs_to_the_process_stderr()
"""


def test_absls_handler_never_closes_the_workers_capture_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flake that errored every later test of one xdist worker at setup: any dictConfig
    closes absl's handler, and absl closes the stream it was made on (the capture file)."""
    pytester.makepyfile(test_two=ABSL_TESTS)
    pytester.makeconftest(ABSL_CONFTEST)
    monkeypatch.setenv("CBOP_TESTS_DIR", str(Path(__file__).resolve().parent))
    monkeypatch.setenv("CBOP_ABSL_FIX", "0")
    without = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert without.ret != 0  # pytest itself loses its stderr: "lost sys.stderr"
    assert "I/O operation on closed file" in without.stdout.str() + without.stderr.str()
    monkeypatch.setenv("CBOP_ABSL_FIX", "1")
    fixed = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    fixed.assert_outcomes(passed=2)


def test_each_program_help_says_what_it_does_and_lists_only_its_own_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from cbop_torchrl.apps import COMMANDS
    from cbop_torchrl.cli import run_entry

    monkeypatch.chdir(tmp_path)
    for command in COMMANDS:
        program = importlib.import_module(f"cbop_torchrl.apps.{command.module}")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert run_entry(program.main, ["--help"]) == 0
        text = out.getvalue()
        assert text.startswith(f"{command.name}: "), text[:200]
        assert "schema:" not in text and "sweep: paper_grid" not in text
        assert ("algo: bc, cql, iql, td3bc" in text) == (command.name == "cbop-baseline")
        assert ("preset: cpu, debug, paper" in text) == (
            command.name in ("cbop-train", "cbop-baseline")
        )
        assert "== Config ==" in text and "Powered by Hydra" in text
    assert list(tmp_path.iterdir()) == []  # --help writes nothing
