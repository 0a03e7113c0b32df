"""The command lines in the README and the quick-start pages are valid commands.

Each ``python scripts/<program>.py key=value ...`` line of their bash blocks is composed with
the program's typed schema (:func:`cbop_torchrl.apps.api.compose_config`, in process, nothing
run): a renamed or removed key, a wrong type or a value outside a key's choices fails here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from omegaconf import MISSING, OmegaConf

from cbop_torchrl.apps.api import compose_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *(ROOT / "docs" / name for name in ("getting-started.md", "datasets.md")),
]
PROGRAMS = {
    "cbop": "cbop",
    "baseline": "baseline",
    "evaluate": "evaluate",
    "collect": "collect",
    "train_dynamics": "train_dynamics",
}


def commands(page: Path) -> list[tuple[str, list[str]]]:
    """(program, overrides) for every single-run command line in the page's bash blocks."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        for line in block.splitlines():
            match = re.match(r"^python scripts/(\w+)\.py(.*)$", line.split(" #")[0].strip())
            if not match or match[1] not in PROGRAMS:
                continue
            arguments = shlex.split(match[2])
            # placeholders (runs/<...>), sweeps (-m) and Hydra's own keys are not the schema's
            if "<" in match[2] or any(a.startswith(("-", "hydra.", "'hydra.")) for a in arguments):
                continue
            found.append((PROGRAMS[match[1]], arguments))
    return found


CASES = [(page, *case) for page in PAGES for case in commands(page)]


def test_the_pages_hold_commands_to_check():
    assert len(commands(ROOT / "README.md")) >= 4


@pytest.mark.parametrize(
    ("page", "program", "overrides"),
    CASES,
    ids=[f"{p.name}:{prog}:{' '.join(o)}"[:80] for p, prog, o in CASES],
)
def test_a_documented_command_composes(page: Path, program: str, overrides: list[str]):
    config = compose_config(overrides, command=program)
    for override in overrides:
        key = override.lstrip("+").partition("=")[0]
        assert OmegaConf.select(config, key, default=MISSING) is not MISSING, override
