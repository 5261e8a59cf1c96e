"""Notebook 8's picture: the chief's training accuracy beside the evaluator's test accuracy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .style import CHIEF, WORKERS

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def accuracy(train: dict[int, float], evaluated: dict[int, float], steps: int) -> Figure:
    """Two curves on one epoch axis: ``train`` maps the epoch index (from 0) of the chief's
    summaries to their accuracy, ``evaluated`` maps the optimizer step of each checkpoint the
    evaluator read to its test accuracy; ``steps`` (steps per epoch) turns steps into epochs."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([epoch + 1 for epoch in train], list(train.values()), marker="o",
            color=WORKERS[0], label="training accuracy (chief)")
    ax.plot([step / steps for step in evaluated], list(evaluated.values()), marker="x",
            color=CHIEF, label="test accuracy (evaluator)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy")
    ax.legend()
    plt.close(fig)  # shown once, as the cell's value, not again as an open pyplot figure
    return fig
