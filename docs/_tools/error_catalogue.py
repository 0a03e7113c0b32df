"""Generates the list of error messages on the troubleshooting page from the source.

Every ``raise SomethingError(...)`` and every ``refuse(...)`` (``cbop_torchrl.cli``: exit code
2) in ``cbop_torchrl/`` with a message written in place is listed, grouped by module, with the
values filled in at run time shown as a plain name in angle brackets (``<seed>``, ``<keys>``),
named after what fills them (:func:`value_name`), as a user sees the message. Internal
programming errors are listed too: they are what a user of the Python API meets.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cbop_torchrl"


WRAPPERS = frozenset(
    "str repr len int float sorted list set tuple join format fspath abs round min max".split()
)
"""Calls whose value is named after their argument (``str(path)`` is the path)."""


def value_name(node: ast.expr) -> str:
    """A plain name for what an expression fills into a message: ``config.seed`` -> ``seed``,
    ``', '.join(k for k in unknown)`` -> ``unknown``, ``str(path)`` -> ``path``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return value_name(node.value)
    if isinstance(node, ast.Call):
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if called in WRAPPERS and node.args:
            return value_name(node.args[0])
        return called or "value"
    if isinstance(node, ast.GeneratorExp | ast.ListComp | ast.SetComp):
        return value_name(node.generators[0].iter)
    if isinstance(node, ast.BinOp):
        return value_name(node.left)
    if isinstance(node, ast.IfExp):
        return value_name(node.body)
    return "value"


def placeholder(node: ast.expr, source: str) -> str:
    """``<name>``: the plain name of the value the expression fills in."""
    return "<" + value_name(node).strip("_").replace("_", " ") + ">"


def message_text(node: ast.expr, source: str) -> str | None:
    """The message an expression builds, placeholders as ``{expression}``; None if not text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append(placeholder(value.value, source))
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = message_text(node.left, source), message_text(node.right, source)
        if left is not None or right is not None:  # text + an expression: show it as {expr}
            return (left if left is not None else placeholder(node.left, source)) + (
                right if right is not None else placeholder(node.right, source)
            )
    return None


def messages(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, message) for every error raised or refused in one module."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        call, kind = None, ""
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            name = node.exc.func
            kind = name.id if isinstance(name, ast.Name) else getattr(name, "attr", "")
            if kind.endswith("Error"):
                call = node.exc
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "refuse":
            call, kind = node, "refused (exit code 2)"
        if call is not None and call.args:
            text = message_text(call.args[0], source)
            if text and text.strip():
                found.append((node.lineno, kind, " ".join(text.split())))
    return sorted(found)


def generate() -> str:
    lines = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found = messages(path)
        if not found:
            continue
        module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
        lines += [f"### `{module}`", ""]
        for line, kind, text in found:
            shown = re.sub(r"([\\`*_\[\]#|])", r"\\\1", text).replace("<", "&lt;")
            lines.append(f"- `{kind}` (line {line}): {shown}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(generate())
