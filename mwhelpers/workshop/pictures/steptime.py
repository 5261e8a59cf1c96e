"""Notebook 03b's picture of where a training step's time goes, part by part."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .style import shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PARTS = ("input", "compute", "all-reduce", "update")
COLORS = {"input": "#9ecae1", "compute": "#3182bd", "all-reduce": "#e6550d",
          "update": "#a1d99b"}


def phases(rows: Mapping[str, Mapping[str, float]], steps: str = "") -> Figure:
    """One stacked bar per run (``rows``: its name to the median milliseconds of each part of
    :data:`PARTS`): how long a step's input, compute, all-reduce and update took."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.6 * len(rows)))
    names = list(rows)[::-1]
    for row, name in enumerate(names):
        left = 0.0
        for part in PARTS:
            ax.barh(row, rows[name][part], left=left, color=COLORS[part],
                    label=part if row == 0 else None)
            left += rows[name][part]
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel(f"median milliseconds per step{' (' + steps + ')' if steps else ''}")
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    return shown_once(fig)
