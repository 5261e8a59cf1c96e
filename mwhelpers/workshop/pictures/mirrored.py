"""Notebook 02's pictures: the runs' losses and the input pipeline's timings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import strategies
from .style import shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def losses(curves: dict[str, list[float]]) -> Figure:
    """The training loss after each epoch of each run (label -> losses)."""
    return strategies.training_losses(curves)


def timings(second_epoch: dict[str, float], fit_seconds: dict[str, float]) -> Figure:
    """Two bar charts: the seconds of the input pipeline's second epoch alone, per way of
    caching (left), and the seconds of one epoch of training, per pipeline (right)."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 2.8))
    left.barh(list(second_epoch), list(second_epoch.values()))
    left.set_title("input pipeline alone: second epoch")
    left.set_xlabel("seconds")
    right.barh(list(fit_seconds), list(fit_seconds.values()))
    right.set_title("training: seconds per epoch")
    right.set_xlabel("seconds")
    fig.tight_layout()
    return shown_once(fig)
