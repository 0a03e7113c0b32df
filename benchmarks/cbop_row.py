"""Each set's CBOP row: the committed results a headline, the bar and the psi grid read.

The rule lives in :mod:`cbop_torchrl.evaluation.headline` (the report draws the headline
figure from it too); this module gives the benchmark tools its names.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbop_torchrl.evaluation.headline import (
    DEFAULT_PSI_ROWS,
    GRID,
    HEADLINE_LABEL,
    SELECTION_NAME,
    SETS,
    current_file,
    find_row,
    grid_rows,
    grid_variant,
    headline_row,
    headline_rows,
    load_rows,
    seed_summaries,
    selected_row,
    summaries_on,
    summary_psi,
    table_psi,
)


@dataclass
class Check:
    """One condition of the bar on one set (or over the sets): whether it holds, and why."""

    where: str
    what: str
    holds: bool
    detail: str


def conservatism_check(dataset: str, gaps: list[float | None]) -> Check:
    """The bar's condition that Q is below the true return at the end on every seed
    (``gaps``: each seed's Q - MC, None where its summary has none)."""
    return Check(
        dataset,
        "Q - MC < 0 at the end, every seed",
        bool(gaps) and all(gap is not None and gap < 0 for gap in gaps),
        ", ".join("n/a" if gap is None else f"{gap:+.1f}" for gap in gaps) or "no summaries",
    )


__all__ = [
    "Check",
    "conservatism_check",
    "find_row",
    "DEFAULT_PSI_ROWS",
    "GRID",
    "HEADLINE_LABEL",
    "SELECTION_NAME",
    "SETS",
    "current_file",
    "grid_rows",
    "grid_variant",
    "headline_row",
    "headline_rows",
    "load_rows",
    "seed_summaries",
    "selected_row",
    "summaries_on",
    "summary_psi",
    "table_psi",
]
