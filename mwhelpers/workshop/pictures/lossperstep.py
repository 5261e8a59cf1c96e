"""Notebook 03b's picture of what ``fit`` reports after each step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .style import shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def running_mean(reported: Sequence[float], own: Sequence[float]) -> Figure:
    """The loss ``fit`` reported after each step (the epoch's running mean) beside each
    step's own loss, recovered from it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 2.6))
    steps = range(1, len(reported) + 1)
    ax.plot(steps, list(reported), marker=".", label="reported by fit (the epoch's running mean)")
    ax.plot(steps, list(own), marker=".", label="each step's own loss, recovered")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return shown_once(fig)
