"""The walk from ``scripts/cbop.py`` to the CBOP update (``python -m tools.update_walk``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOST_FILES = 8
UPDATE_PAGE = "cbop_torchrl/objectives/cbop_update.py"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def update_walk(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 (the tools module)
    monkeypatch.syspath_prepend(str(ROOT))
    sys.modules.pop("tools.update_walk", None)
    from tools import update_walk

    return update_walk


def test_a_debug_run_enters_at_most_eight_files_from_the_script_to_the_update(
    tmp_path: Path, update_walk
) -> None:  # noqa: ANN001
    files = update_walk.walk(run_dir=tmp_path / "run")
    paths = [file.path for file in files]
    shown = "\n".join(f"{file.path}: {', '.join(file.functions)}" for file in files)
    assert paths[0] == "scripts/cbop.py" and paths[-1] == UPDATE_PAGE, shown
    assert len(set(paths) - {"scripts/cbop.py"}) <= MOST_FILES, shown  # entered after it
    assert (tmp_path / "run" / "results.json").is_file()  # the run went on to its end


def test_the_walk_keeps_the_projects_files_only_and_merges_a_files_consecutive_frames(
    update_walk,
) -> None:  # noqa: ANN001
    import traceback

    def frame(path: Path | str, name: str) -> traceback.FrameSummary:
        return traceback.FrameSummary(str(path), 1, name)

    files = update_walk.project_files(
        [
            frame("<frozen runpy>", "_run_code"),
            frame(ROOT / "scripts" / "cbop.py", "<module>"),
            frame(Path(sys.executable).parent / "hydra.py", "run"),
            frame(ROOT / "cbop_torchrl" / "apps" / "cbop.py", "main"),
            frame(ROOT / "cbop_torchrl" / "apps" / "cbop.py", "run"),
            frame(ROOT / ".venv" / "lib" / "site-packages" / "torchrl" / "t.py", "train"),
        ]
    )
    assert [(f.path, f.functions) for f in files] == [
        ("scripts/cbop.py", ("<module>",)),
        ("cbop_torchrl/apps/cbop.py", ("main", "run")),
    ]
