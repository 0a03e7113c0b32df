"""The project files a run passes through from ``scripts/cbop.py`` to the CBOP update.

    python -m tools.update_walk                  # the debug preset on the bundled demo data
    python -m tools.update_walk preset=cpu ...   # any cbop-train overrides

Runs ``scripts/cbop.py`` in this process and, at the first call of
:func:`cbop_torchrl.objectives.cbop_update.cbop_update` (the whole gradient step), reads the
call stack: the project's files on it, outermost first, each with the functions it has
there (TorchRL's, Hydra's and Python's own frames in between are left out), and last the
update's own file. The run then
goes on to its end. It prints one line per file and how many files the walk enters after
the script it starts in.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cbop.py"
DEFAULT_OVERRIDES = ("preset=debug", "progress=false", "resume=false")
PROJECT_PARTS = ("scripts", "cbop_torchrl")  # the program and its package


@dataclass(frozen=True)
class StackFile:
    """One project file on the stack: its path from the repository root and its functions."""

    path: str
    functions: tuple[str, ...]


def project_files(frames: Sequence[traceback.FrameSummary]) -> list[StackFile]:
    """The repository's files among ``frames`` (outermost first), consecutive frames of one
    file merged; a file entered twice (left and come back to) is listed twice."""
    files: list[StackFile] = []
    for frame in frames:
        if frame.filename.startswith("<"):  # "<frozen runpy>", "<string>": not a file
            continue
        path = Path(frame.filename).resolve()
        if not any(path.is_relative_to(ROOT / part) for part in PROJECT_PARTS):
            continue  # tests, tools, the environment's packages, Python's own
        relative = path.relative_to(ROOT).as_posix()
        if files and files[-1].path == relative:
            files[-1] = StackFile(relative, (*files[-1].functions, frame.name))
        else:
            files.append(StackFile(relative, (frame.name,)))
    return files


def _spy_on_update(record: list[StackFile]) -> Callable[[], None]:
    """Replaces ``cbop_update`` wherever the package holds it by a function that records the
    stack at its first call; returns the function that puts the real one back."""
    import cbop_torchrl.apps.cbop  # noqa: F401  (the modules that bind the update, loaded)
    import cbop_torchrl.trainers.offline  # noqa: F401
    from cbop_torchrl.objectives import cbop_update as page

    real = page.cbop_update

    def spy(*args: Any, **kwargs: Any) -> Any:
        if not record:  # the callers, then the update's own page
            record.extend(project_files(traceback.extract_stack()[:-1]))
            page_file = Path(real.__code__.co_filename).resolve().relative_to(ROOT)
            record.append(StackFile(page_file.as_posix(), (real.__name__,)))
        return real(*args, **kwargs)

    holders = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("cbop_torchrl") and getattr(module, "cbop_update", None) is real
    ]
    for module in holders:
        module.cbop_update = spy

    def restore() -> None:
        for module in holders:
            module.cbop_update = real

    return restore


def walk(
    overrides: Sequence[str] = DEFAULT_OVERRIDES, run_dir: str | Path | None = None
) -> list[StackFile]:
    """Runs ``scripts/cbop.py`` with ``overrides`` in this process; the project files on the
    stack at the first CBOP update (empty when the run never reached one).

    Raises:
        SystemExit: the run itself ended with a non-zero exit code.
    """
    record: list[StackFile] = []
    restore = _spy_on_update(record)
    saved_argv = sys.argv
    with tempfile.TemporaryDirectory() as scratch:
        directory = run_dir if run_dir is not None else Path(scratch) / "run"
        sys.argv = [str(SCRIPT), *overrides, f"hydra.run.dir={directory}"]
        try:
            runpy.run_path(str(SCRIPT), run_name="__main__")
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        finally:
            sys.argv = saved_argv
            restore()
    return record


def main(argv: Sequence[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv) or list(DEFAULT_OVERRIDES)
    files = walk(overrides)
    if not files:
        print("the run ended without a CBOP update", file=sys.stderr)
        return 1
    for file in files:
        print(f"{file.path}: {', '.join(file.functions)}")
    entered = {file.path for file in files} - {files[0].path}
    print(f"{len(entered)} project files entered from {files[0].path} to the update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
