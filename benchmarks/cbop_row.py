"""Each set's CBOP row: the committed results a headline, the bar and the psi grid read.

The rule lives in :mod:`cbop_torchrl.evaluation.headline` (the report draws the headline
figure from it too); this module gives the benchmark tools its names.
"""

from __future__ import annotations

from cbop_torchrl.evaluation.headline import (
    DEFAULT_PSI_ROWS,
    GRID,
    HEADLINE_LABEL,
    SELECTION_NAME,
    SETS,
    current_file,
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

__all__ = [
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
