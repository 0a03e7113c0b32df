"""Which row of a benchmark set is each algorithm's in the headline: one rule for every page.

A set's results live in ``<results>/<set>/``: ``rows.json`` (``python benchmarks/learning.py
--rows``) and one folder of per-seed summaries per variant. Each protocol's headline (a table
on the README, the results page and the report, and the report's curves of the same rows)
shows one row per algorithm, :func:`headline_rows`:

- with :data:`HEADLINE_LABEL` None, CBOP's row is the psi fitted Q evaluation chose offline
  (``psi_selection.json``, ``benchmarks/psi_grid.py --select``), else the psi grid's row at
  the psi the paper's D4RL table gives the set (:func:`headline_row`), and each baseline's row
  is its own name (``bc``, ``td3bc``, ...);
- with a benchmark label (:data:`LONG_LABEL`, ``"50k"``), every algorithm's row is
  ``<algo>-<label>`` (``cbop-50k``, ``bc-50k``, ...): the rows of that protocol.

The 50,000-step protocol's rows (:func:`long_headlines_in`) come first on every page and in
the report (``curves_<set>.png``); the 20,000-step rows (:func:`headlines_in`) follow as the
earlier protocol (``curves_20k_<set>.png``).

The psi grid's rows are the variants ``cbop-psi<value>`` (:data:`GRID`). ``benchmarks/bar.py``,
``benchmarks/psi_grid.py``, the report (:func:`~cbop_torchrl.evaluation.report.write_report`)
and the docs' tables all read the rows through this module, so they name the same row for a
set. Torch is imported only to read the paper's table (:func:`table_psi`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from cbop_torchrl.evaluation.protocol import LONG_SUFFIX
from cbop_torchrl.evaluation.summaries import BASELINES
from cbop_torchrl.io import find_regular_files, read_regular_text

SETS = ("hopper-medium-replay-gen", "walker2d-medium-replay-gen", "halfcheetah-medium-replay-gen")
"""The three D4RL-level generated sets the results are reported on."""
HEADLINE_LABEL: str | None = None
"""The benchmark label (``benchmarks/learning.py --label``) whose rows :func:`headline_rows`
gives by default; None: the 20,000-step rows (CBOP's row by :func:`headline_row`, the
baselines' by their names), which ``benchmarks/bar.py`` and ``benchmarks/psi_grid.py`` judge."""
LONG_LABEL = LONG_SUFFIX.removeprefix("-")
"""The 50,000-step protocol's label (``"50k"``): its rows, ``<algo>-50k``, are the headline
shown first (:func:`long_headlines_in`)."""
HEADLINE_ALGOS = ("cbop", *BASELINES)
"""The algorithms of the headline, in its order."""
SELECTION_NAME = "psi_selection.json"
"""Each set's offline choice of psi, ``<results>/<set>/psi_selection.json``."""
GRID = (0.5, 2.0, 3.0, 5.0)
"""The paper's psi grid (appendix, "Hyperparameters")."""
DEFAULT_PSI_ROWS = ("cbop-starts", "cbop")
"""The CPU preset's own rows, which count at the set's default psi, in order of preference:
``cbop-starts`` (hopper's rerun with the start-state measure) before ``cbop`` (on hopper, the
runs that chose the preset's critic sizes)."""


def load_rows(results: Path, dataset: str) -> dict | None:
    """The set's ``rows.json``, or None where it has none."""
    path = Path(results) / dataset / "rows.json"
    return json.loads(path.read_text()) if path.is_file() else None


def current_file(rows: dict) -> str:
    """The set's current file as rows name it (``dataset_sha256``: 12 characters)."""
    return str(rows["sha256"])[:12]


def seed_summaries(results: Path, dataset: str, variant: str, file: str) -> list[dict]:
    """The variant's per-seed summaries made on the file whose sha256 begins with ``file``."""
    summaries = []
    for path in find_regular_files(Path(results) / dataset / variant, "seed*.json", depth=0):
        summary = json.loads(read_regular_text(path))
        if str(summary.get("dataset_provenance", {}).get("sha256"))[:12] == file:
            summaries.append(summary)
    return summaries


def summaries_on(results: Path, dataset: str, variant: str, file: str) -> dict[int, dict]:
    """The variant's summaries made on the file whose sha256 begins with ``file``, by seed."""
    return {int(s["seed"]): s for s in seed_summaries(results, dataset, variant, file)}


def summary_psi(summary: dict) -> float | None:
    """The psi a CBOP run trained with (its resolved settings)."""
    psi = summary.get("diagnostics", {}).get("settings", {}).get("psi")
    return None if psi is None else float(psi)


def grid_variant(psi: float) -> str:
    """The benchmark variant of one grid value (``cbop-psi0.5``, ``cbop-psi2``)."""
    return f"cbop-psi{psi:g}"


def grid_rows(results: Path, dataset: str) -> dict[float, tuple[str, dict[int, dict]]]:
    """Per grid psi: the row's variant and its summaries on the set's current file, by seed.

    Per psi the row is the variant with the most seeds there; ties go to ``cbop-psi<value>``,
    then to :data:`DEFAULT_PSI_ROWS` in their order. A psi without a run is left out.
    """
    rows = load_rows(results, dataset)
    if rows is None:
        return {}
    file = current_file(rows)
    grid = {}
    for psi in GRID:
        options = []
        for preference, variant in enumerate((grid_variant(psi), *DEFAULT_PSI_ROWS)):
            found = summaries_on(results, dataset, variant, file)
            found = {seed: s for seed, s in found.items() if summary_psi(s) == psi}
            if found:
                options.append((len(found), -preference, variant, found))
        if options:
            _, _, variant, found = max(options, key=lambda option: option[:2])
            grid[psi] = (variant, found)
    return grid


def selected_row(results: Path, dataset: str) -> str | None:
    """The set's row of the psi FQE chose, or None where no choice has been made."""
    path = Path(results) / dataset / SELECTION_NAME
    variant = json.loads(path.read_text()).get("variant") if path.is_file() else None
    return None if variant is None else str(variant)  # null: the grid is not complete yet


def table_psi(dataset: str) -> float:
    """The psi the paper's D4RL table gives the set's family and kind."""
    from cbop_torchrl.config import infer_dataset_kind, paper_settings

    family = dataset.split("-", 1)[0]
    return float(paper_settings(family, infer_dataset_kind(dataset))["estimator.psi"])


def headline_row(results: Path, dataset: str) -> str:
    """The set's CBOP row in the 20,000-step headline: the offline choice of psi where one is
    made, else the grid's row at the D4RL table's psi (``cbop-psi<value>`` when that psi has no
    run yet, so a check names the row it misses)."""
    if chosen := selected_row(results, dataset):
        return chosen
    psi = table_psi(dataset)
    found = grid_rows(results, dataset).get(psi)
    return found[0] if found else grid_variant(psi)


def headline_rows(
    results: Path, dataset: str, label: str | None = HEADLINE_LABEL
) -> dict[str, str]:
    """``algo -> variant``: the set's row of each algorithm in the headline (module doc)."""
    if label:
        return {algo: f"{algo}-{label}" for algo in HEADLINE_ALGOS}
    return {"cbop": headline_row(results, dataset), **{name: name for name in BASELINES}}


def results_sets(paths: Iterable[str | Path]) -> dict[str, Path]:
    """``dataset -> results folder`` for each set a benchmark results folder among ``paths``
    holds (a ``<path>/<set>/rows.json``); the first folder that holds a set names it."""
    found: dict[str, Path] = {}
    for path in map(Path, paths):
        if path.is_dir():
            for rows in find_regular_files(path, "rows.json", depth=1):
                found.setdefault(rows.parent.name, path)
    return found


def current_files_in(paths: Iterable[str | Path]) -> dict[str, str]:
    """``dataset -> its current file`` (the one its ``rows.json`` names) for each set of a
    results folder among ``paths``: what
    :func:`~cbop_torchrl.evaluation.summaries.load_summaries` takes as ``current``."""
    current = {}
    for dataset, folder in results_sets(paths).items():
        rows = load_rows(folder, dataset)
        if rows and rows.get("sha256"):
            current[dataset] = current_file(rows)
    return current


def headlines_in(paths: Iterable[str | Path]) -> dict[str, dict[str, str]]:
    """``dataset -> algo -> variant`` (:func:`headline_rows`) for each set of a benchmark
    results folder among ``paths``; sets elsewhere (run or sweep directories) are left out,
    each algorithm's row there being its own name."""
    sets = results_sets(paths)
    return {dataset: headline_rows(folder, dataset) for dataset, folder in sets.items()}


def long_headlines_in(paths: Iterable[str | Path]) -> dict[str, dict[str, str]]:
    """``dataset -> algo -> variant`` of the 50,000-step protocol (``cbop-50k``, ``bc-50k``,
    ...; :data:`LONG_LABEL`) for each set of a benchmark results folder among ``paths``, in
    :data:`SETS`' order, then any other set by name; empty where ``paths`` hold no results
    folder (run or sweep directories)."""
    sets = results_sets(paths)
    order = [d for d in SETS if d in sets] + sorted(d for d in sets if d not in SETS)
    return {dataset: headline_rows(sets[dataset], dataset, LONG_LABEL) for dataset in order}


def find_row(rows: dict, variant: str, measure: str) -> dict | None:
    """The variant's row of a ``rows.json`` (:func:`load_rows`) on the set's current file and
    ``measure`` (``reset`` or ``starts``), or None where it has none."""
    file = current_file(rows)
    for row in rows["rows"]:
        if (row["variant"], row["measure"], row.get("dataset_sha256")) == (variant, measure, file):
            return row
    return None


def headline_of(
    headline: Mapping[str, Mapping[str, str]] | None, dataset: str
) -> Mapping[str, str]:
    """The set's ``algo -> variant`` from ``headline``; an algorithm it does not name (every
    one, for a set it does not hold) is its own name's row."""
    return {algo: algo for algo in HEADLINE_ALGOS} | dict((headline or {}).get(dataset, {}))


__all__ = [
    "DEFAULT_PSI_ROWS",
    "GRID",
    "HEADLINE_ALGOS",
    "HEADLINE_LABEL",
    "LONG_LABEL",
    "SELECTION_NAME",
    "SETS",
    "current_file",
    "find_row",
    "grid_rows",
    "grid_variant",
    "headline_of",
    "headline_row",
    "headline_rows",
    "current_files_in",
    "headlines_in",
    "long_headlines_in",
    "load_rows",
    "results_sets",
    "seed_summaries",
    "selected_row",
    "summaries_on",
    "summary_psi",
    "table_psi",
]
