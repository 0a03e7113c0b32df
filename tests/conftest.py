"""Shared fixtures: every test gets its own project cache, TorchRL dataset root and logging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from programs import absl_logs_to_the_process_stderr, logging_restored

pytest_plugins = ("pytester",)  # tests/test_cli_messages.py runs a session of two tests
LOGGING_ISOLATION = "cbop-logging-isolation"


class LoggingIsolation:
    """Undoes the logging configuration each test made (and its fixtures), after teardown.

    A program run in-process configures Hydra's logging: a handler on the root logger that
    writes to ``sys.stdout``/``sys.stderr`` as they were during that test (pytest's capture
    stream, closed afterwards). Left in place, the next test that logs, in the same worker,
    gets "--- Logging error --- ... I/O operation on closed file" on its stderr. Around the
    whole test (not a fixture) so pytest's own per-phase capture handlers are never saved.
    """

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        with logging_restored():
            return (yield)


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist each worker already has a core; torch's default (one thread per
    # core in every worker) would oversubscribe the machine.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    config.pluginmanager.register(LoggingIsolation(), LOGGING_ISOLATION)
    absl_logs_to_the_process_stderr()


#: The files that take longest (worker-seconds in a quiet ``pytest --junitxml`` run), run
#: first: under ``--dist loadfile`` each worker takes the next file when it finishes one, so a
#: long file collected last keeps one worker busy while the other has nothing left. Only the
#: order changes. pytest-xdist would otherwise reorder the files by their number of tests
#: (pyproject's ``--no-loadscope-reorder`` keeps this order).
LONGEST_FIRST = (
    "test_slicing.py", "test_reliability_rules.py", "test_install.py", "test_run_state.py",
    "test_collect.py", "test_bundle.py", "test_refusals_cbop_train.py", "test_config.py",
    "test_gpu_session.py", "test_gpu_grid.py", "test_refusals_across_programs.py",
    "test_report.py", "test_refusals_outputs_and_caches.py", "test_learning_groupings.py",
    "test_sweep.py", "test_baselines.py", "test_tasks.py", "test_score.py", "test_docs_site.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Points ``CBOP_TORCHRL_CACHE`` at a fresh directory so tests never touch ``~/.cache``."""
    cache = tmp_path / "cbop_cache"
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(cache))
    return cache


@pytest.fixture
def one_torch_thread():
    """Tiny networks: one torch thread avoids thread-pool overhead on a busy machine
    (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def torchrl_root(tmp_path: Path) -> Path:
    """A private stand-in for ``~/.cache/torchrl`` (pass as ``torchrl_root=``)."""
    root = tmp_path / "torchrl_cache"
    root.mkdir()
    return root


@pytest.fixture
def no_repository_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's sets without the repository's copies (benchmarks/set_files.py), so a
    test's own file in the cache is the one the benchmark driver reads."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import set_files

    monkeypatch.setattr(set_files, "DEMO_COPIES", {})
    monkeypatch.setattr(set_files, "COPIES", tmp_path / "no-repository-copies.json")


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A finished debug CBOP run, trained once per test process and only read by the tests
    that take it (a test that edits a file edits a copy): ``{"root", "dataset", "env", "run"}``.
    """
    from d4rl_files import debug_cbop_command, pipeline_workspace
    from inprocess import train_cbop

    root = tmp_path_factory.mktemp("finished_run")
    workspace = pipeline_workspace(root)
    run = root / "run"
    train_cbop(debug_cbop_command(workspace, run)[2:], run, workspace["env"])
    return {**workspace, "run": run}
