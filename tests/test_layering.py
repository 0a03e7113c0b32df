"""The package's import graph: every import points down the stack, and none forms a circle.

The graph is read from the source with ``ast`` (imports inside functions
included), so a lazy import cannot hide an upward edge or a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cbop_torchrl"

LAYERS: tuple[tuple[str, ...], ...] = (
    # files and the cache (io), the running process (runtime)
    ("cbop_torchrl.io", "cbop_torchrl.runtime", "cbop_torchrl._torchrl_compat"),
    ("cbop_torchrl.config.choices",),  # the choices' allowed values: plain enums
    ("cbop_torchrl.registry",),
    ("cbop_torchrl.data",),
    ("cbop_torchrl.envs",),
    ("cbop_torchrl.modules",),
    ("cbop_torchrl.objectives",),
    # The fast paths wrap the objectives (the eager forms never import them).
    ("cbop_torchrl.accel",),
    # Behaviour-data generation trains a SAC agent, so it sits above modules and
    # objectives even though it writes files the data loaders read.
    (
        "cbop_torchrl.data.collect_env",
        "cbop_torchrl.data.collect_sac",
        "cbop_torchrl.data.generate",
    ),
    ("cbop_torchrl.config",),  # the run configuration, below everything that reads it
    (
        "cbop_torchrl.trainers",
        "cbop_torchrl.baselines",
        "cbop_torchrl.sweeps",
    ),
    ("cbop_torchrl.evaluation",),
    ("cbop_torchrl.cli",),  # Hydra main and exit codes, rephrased errors, --help, the schemas
    ("cbop_torchrl.apps",),  # the programs and the Python API
    # the package's own __init__ (the public API) and `python -m cbop_torchrl` on top
    ("cbop_torchrl", "cbop_torchrl.__main__"),
)
"""Bottom to top. A module's layer is the one with the longest prefix of its name.
A module may import from its own layer (without a circle) and from layers below."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import submodule`` resolved)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def layer_of(name: str) -> int:
    best, best_length = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best is not None, f"{name} is in no layer; add it to LAYERS in {__file__}"
    return best


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_graph_sees_every_module_and_lazy_imports() -> None:
    graph = import_graph()
    assert "cbop_torchrl.trainers.offline_run" in graph
    assert "cbop_torchrl.envs" in graph["cbop_torchrl.trainers.offline_run"]
    assert "cbop_torchrl.envs.task" in graph["cbop_torchrl.envs"]
    # sources imports the D4RL and Minari loaders inside a function
    assert {"cbop_torchrl.data.d4rl", "cbop_torchrl.data.minari"} <= graph[
        "cbop_torchrl.data.sources"
    ]


def test_no_module_imports_from_a_layer_above() -> None:
    upward = [
        f"{source} (layer {layer_of(source)}) imports {target} (layer {layer_of(target)})"
        for source, targets in import_graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(source)
    ]
    assert upward == []


def test_there_is_no_import_circle() -> None:
    assert find_cycle(import_graph()) is None


def test_the_checks_catch_an_upward_import_and_a_circle() -> None:
    graph = {name: set(targets) for name, targets in import_graph().items()}
    graph["cbop_torchrl.data.hdf5"].add("cbop_torchrl.data.sources")  # sources -> hdf5 exists
    assert find_cycle(graph) is not None
    assert layer_of("cbop_torchrl.evaluation.report") > layer_of("cbop_torchrl.trainers.offline")
    assert layer_of("cbop_torchrl.data.generate") > layer_of("cbop_torchrl.modules.actor_critic")
    assert layer_of("cbop_torchrl.data.hdf5") < layer_of("cbop_torchrl.modules.actor_critic")
