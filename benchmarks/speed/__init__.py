"""The speed benchmark's measurements; ``scripts/bench.py`` runs them and writes the report."""

from pathlib import Path

#: The repository root: the configs, the git history and ``benchmarks/large_dataset.py``.
REPO = Path(__file__).resolve().parents[2]
