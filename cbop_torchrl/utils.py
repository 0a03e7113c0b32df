"""Small helpers shared by every stage: cache location, atomic writes, seeding, devices."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode


def cache_root() -> Path:
    """Root of the project's caches (``$CBOP_TORCHRL_CACHE`` or ``~/.cache/cbop_torchrl``)."""
    return Path(os.environ.get("CBOP_TORCHRL_CACHE", Path.home() / ".cache" / "cbop_torchrl"))


def cache_dir(*parts: str) -> Path:
    """A directory under :func:`cache_root`, created on demand."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


_running_program: str | None = None


def set_running_program(name: str | None) -> None:
    """Records which of the package's programs this process runs (``cbop-train``, ...).

    Set by :func:`cbop_torchrl.apps.launch` for the console scripts, ``scripts/*.py`` and
    ``python -m cbop_torchrl <command>``; error messages then suggest that program.
    """
    global _running_program
    _running_program = name


def running_program() -> str | None:
    """The program recorded by :func:`set_running_program`; None from Python (API, notebooks)."""
    return _running_program


def program_command(name: str) -> str:
    """How to start the package's program ``name`` (``cbop-collect``) from the user's shell.

    Error messages suggest commands built on it, and a suggestion must work as
    written for a ``pip install`` of the wheel and a checkout set up with
    ``setup.sh`` (an editable install) alike: both put the console script next
    to this Python interpreter. Returns the bare name when the shell finds that
    very script on ``PATH`` (an activated venv), else the script's full path,
    else (the package imported without being installed)
    ``<python> -m cbop_torchrl <name>``.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        found = shutil.which(name)
        if found is not None and Path(found).resolve() == beside.resolve():
            return name
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m cbop_torchrl {name}"


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


@contextlib.contextmanager
def cache_entry_lock(directory: str | Path, what: str) -> Iterator[None]:
    """Holds an exclusive lock on a cache entry (``<directory>/.lock``) while it is read or made.

    Runs that share an entry (every psi of a sweep with one seed shares the BC,
    FQE and dynamics stages) then make it once: the first trains it, the others
    wait, say so, and read the finished entry. An OS file lock (``flock``), so
    a process that dies releases it.
    """
    import fcntl

    path = Path(directory) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"[cbop] waiting for another process that is making the same {what} "
                f"({directory})", flush=True,
            )  # fmt: skip
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def config_hash(config: Any, length: int = 12) -> str:
    """A stable short hash of a JSON-serializable config, used as a cache key."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Calls ``write(tmp_path)`` and renames the result onto ``path``.

    A reader sees either the old file or the complete new one, never a partial
    write, even if the process is killed in between.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp_name)
    try:
        write(tmp_path)
        with open(tmp_path, "rb+") as handle:
            os.fsync(handle.fileno())
        # mkstemp creates 0600 files; give the result the usual umask-based permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
    return path


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` through :func:`atomic_write`. Load with ``weights_only=True``."""
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def describe_load_error(error: BaseException) -> str:
    """A one-line reason why ``torch.load(..., weights_only=True)`` failed.

    PyTorch's own message for a file holding other objects than tensors and
    plain containers suggests ``weights_only=False``, which would run the
    file's pickled code; this project never loads that way, so that advice is
    replaced by what the failure means.
    """
    text = str(error)
    if "weights_only" in text or "Weights only load failed" in text:
        return (
            "it holds objects other than tensors and plain containers, which "
            "torch.load(weights_only=True) refuses to unpickle"
        )
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__


def atomic_json_dump(obj: Any, path: str | Path) -> Path:
    """Writes ``obj`` as indented JSON through :func:`atomic_write`."""

    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")

    return atomic_write(path, write)


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else CPU; ``"cuda"`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise RuntimeError(
            f"device={device!r} is not a device; use auto, cpu, cuda or cuda:<index>."
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} was requested but no CUDA device is available; "
            "use device=cpu or device=auto."
        )
    return resolved


class HostSyncCounter(TorchDispatchMode):
    """Counts the operations that make the host wait for the device, while active.

    Counted: ``aten._local_scalar_dense`` (``.item()``, ``bool()``/``float()``/
    ``int()`` of a tensor, ``if tensor:``), copies from a non-CPU device to the
    CPU (``.cpu()``, ``.tolist()``, ``.to("cpu")``) and ops whose output shape
    depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``).
    On a CPU-only machine nothing waits, but the same Python code makes the
    same calls, so counting them on CPU tells how often a GPU run would stall.

    Example::

        with HostSyncCounter() as counter:
            update(batch)
        counter.count, counter.by_op  # total and {op name: count}
    """

    _DATA_DEPENDENT = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique")

    def __init__(self) -> None:
        super().__init__()
        self.by_op: dict[str, int] = {}

    @property
    def count(self) -> int:
        return sum(self.by_op.values())

    def _add(self, name: str) -> None:
        self.by_op[name] = self.by_op.get(name, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func.name()
        if name == "aten::_local_scalar_dense" or name.startswith(self._DATA_DEPENDENT):
            self._add(name)
        elif name in ("aten::_to_copy", "aten::copy_") and args:
            source = args[1] if name == "aten::copy_" else args[0]
            target = args[0].device if name == "aten::copy_" else kwargs.get("device")
            if (
                isinstance(source, torch.Tensor)
                and source.device.type != "cpu"
                and target is not None
                and torch.device(target).type == "cpu"
            ):
                self._add(f"{name} (device to host)")
        elif name == "aten::index.Tensor" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())
        ):
            self._add("aten::index.Tensor (boolean mask)")
        return func(*args, **kwargs)
