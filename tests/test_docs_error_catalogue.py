"""The troubleshooting page's error catalogue finds the errors the package raises or refuses."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "error_catalogue", ROOT / "docs" / "_tools" / "error_catalogue.py"
)
error_catalogue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(error_catalogue)


def test_raised_and_refused_messages_are_found_with_their_placeholders(tmp_path: Path):
    module = tmp_path / "module.py"
    module.write_text(
        "def f(seed):\n"
        "    raise ConfigError(f'seed={seed} must be an integer, e.g. seed=0')\n"
        "def g(path, unknown):\n"
        "    refuse('cannot write ' + f'{str(path)!r}: '\n"
        "           + f\"{', '.join('a.' + k for k in unknown)}\")\n"
        "def h():\n"
        "    raise RuntimeError(message)\n"  # not a message written in place: not listed
    )
    found = error_catalogue.messages(module)
    assert found == [
        (2, "ConfigError", "seed=<seed> must be an integer, e.g. seed=0"),
        (4, "refused (exit code 2)", "cannot write <path>: <unknown>"),
    ]


def test_every_error_raised_with_a_written_message_is_in_the_catalogue():
    """Counted independently of the AST walk: a regex over the source."""
    catalogue = error_catalogue.generate()
    sections = {
        block.split("`", 2)[1]: block.count("\n- `") for block in catalogue.split("### ")[1:]
    }
    for path in sorted((ROOT / "cbop_torchrl").rglob("*.py")):
        written = len(re.findall(r"raise \w*Error\(\s*f?[\"']", path.read_text()))
        if written:
            module = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            assert sections.get(module, 0) >= written, module


def test_the_catalogue_shows_messages_as_a_user_sees_them():
    catalogue = error_catalogue.generate()
    assert "&lt;" in catalogue  # placeholders named plainly, <seed>
    assert not re.search(r"\{[^}]*[(.'][^}]*\}", catalogue)  # no f-string source such as {x.y}
