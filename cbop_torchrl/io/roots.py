"""Where the package writes: the cache's root, the folders it owns, and the output setting.

At the bottom of :mod:`cbop_torchrl.io`: the other modules ask here whether a path lies in
the cache (a message then suggests moving the cache) and which setting chooses where the
running program writes (a message then suggests that setting).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Root of the project's caches (``$CBOP_TORCHRL_CACHE`` or ``~/.cache/cbop_torchrl``)."""
    return Path(os.environ.get("CBOP_TORCHRL_CACHE", Path.home() / ".cache" / "cbop_torchrl"))


def unwritable_reason(path: str | Path) -> str | None:
    """Why the directory ``path`` cannot be created or written into; None when it can.

    Looks at the nearest part of ``path`` that exists (nothing is created): it
    must be a directory this process may write to (``os.access``, so a root
    user's writes into a read-only-mode directory count as allowed, as they
    are; a read-only file system does not).
    """
    path = Path(path).expanduser().absolute()
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                return f"{str(existing)!r} is a file, not a directory"
            if not os.access(existing, os.W_OK | os.X_OK):
                return f"{str(existing)!r} is not writable by this user"
            return None
    return f"no part of {str(path)!r} exists"


def is_within(path: str | Path, root: str | Path) -> bool:
    """Whether ``path`` (links resolved) lies in the folder ``root`` (or is it)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except (ValueError, OSError):
        return False
    return True


_output_setting: str | None = None


def set_output_setting(key: str | None) -> None:
    """The setting that chooses where the running program writes (``hydra.run.dir``,
    ``out``, ``json``, ...), which its messages about refused writes suggest."""
    global _output_setting
    _output_setting = key


def output_setting() -> str:
    """The setting recorded by :func:`set_output_setting` (or ``the output setting``)."""
    return _output_setting or "the output setting"


_write_roots: list[Path] = []


def lexical(path: str | Path) -> Path:
    """``path`` absolute, without resolving links (so that a link on the way stays visible)."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def add_write_root(directory: str | Path) -> None:
    """Registers a folder the package owns (a run directory once claimed): below it, no
    folder on the way to a written file may be a link (:func:`cbop_torchrl.io.check_no_link`)."""
    root = lexical(directory)
    if root not in _write_roots:
        _write_roots.append(root)


def write_roots() -> list[Path]:
    """The folders the package owns: those registered by :func:`add_write_root`, then the
    cache root (each absolute, links not resolved)."""
    return [*_write_roots, lexical(cache_root())]
