"""``--help`` is printed by the entry point (:func:`cbop_torchrl.cli.print_help`), not by
Hydra, whose own help lists every config group's options (seconds per call) for template
variables the programs' help does not use: the text must stay Hydra's, byte for byte."""

from __future__ import annotations

import contextlib
import io
import string
from pathlib import Path

import pytest
from hydra._internal.hydra import Hydra

from cbop_torchrl import cli
from cbop_torchrl.apps import evaluate


def _help(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run_entry(evaluate.main, argv)
    return code, out.getvalue(), err.getvalue()


def test_the_entry_points_help_is_hydras_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["episodes=3", "task.gym_id=Hopper-v4", "--help", "--resolve"]

    def not_hydras(*args: object, **kwargs: object) -> None:
        raise AssertionError("--help went to Hydra's app_help")

    with monkeypatch.context() as patch:
        patch.setattr(Hydra, "app_help", not_hydras)
        fast = _help(argv)
    with monkeypatch.context() as patch:  # no help request seen: Hydra's own --help
        patch.setattr(cli.entry, "help_arguments", lambda argv: None)
        hydras = _help(argv)
    assert fast == hydras
    code, text, _ = fast
    assert code == 0 and text.startswith("cbop-evaluate: ")
    assert "episodes: 3\n" in text and "gym_id: Hopper-v4\n" in text
    assert list(tmp_path.iterdir()) == []


def test_help_is_left_to_hydra_when_the_template_lists_config_groups() -> None:
    variables = cli.template_variables(string.Template("$CONFIG ${APP_CONFIG_GROUPS} $$HOME"))
    assert variables == {"CONFIG", "APP_CONFIG_GROUPS"}
    assert cli.template_variables(string.Template("costs $ 5")) is None
    assert cli.help_arguments(["env=demo", "--help"]).overrides == ["env=demo"]
    assert cli.help_arguments(["-h"]) is not None
    for argv in (["--help", "--hydra-help"], ["--help", "--config-name", "baseline"], ["-m"]):
        assert cli.help_arguments(argv) is None, argv
