"""Notebook 6's pictures: a fault and its restart on the axis of global steps.

``step_timeline`` draws what one supervised job did: the backups of the first attempt, the
SIGKILL, the step the restart restored, and the steps it did again. ``loss_curves`` draws the
loss of each attempt against the global step (notebook 7 uses it too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .style import CHIEF, WORKERS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REDONE = "#ffbb78"        # the steps a restart does a second time


def _bar(ax: Axes, row: float, start: int, end: int, color: str, alpha: float = 1.0) -> None:
    """Steps ``start + 1 .. end`` of one attempt as a bar on ``row``."""
    if end > start:
        ax.barh(row, end - start, left=start, height=0.5, color=color, edgecolor="#444444",
                alpha=alpha)


def step_timeline(*, total: int, per_epoch: int, backups: Sequence[int], killed_after: int,
                  restored: int, keras_alone: bool = True) -> Figure:
    """A fault on the axis of global steps, one row per attempt.

    Row "attempt 1" trains steps 1 to ``killed_after``, the last step done before the kill (a
    red cross); a tick marks each backup in ``backups`` (the global steps it was taken after).
    Row "attempt 2" starts after ``restored``, the backup it found, and trains to ``total``; the
    steps ``restored + 1 .. killed_after`` are coloured as done twice. With ``keras_alone``,
    a third row shows where Keras 3 on its own starts instead: at the first batch of the
    restored backup's epoch (``per_epoch`` steps an epoch), so the batches of that epoch before
    the backup (red) go into the weights a second time.
    """
    import matplotlib.pyplot as plt

    rows = 3 if keras_alone else 2
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.75 * rows))
    top = rows - 1
    _bar(ax, top, 0, killed_after, WORKERS[0])
    ax.text(0, top - 0.35, f"steps 1 to {killed_after}; black ticks: backups", ha="left",
            va="top", fontsize=8)
    for step in backups:
        if step <= killed_after:
            ax.plot([step, step], [top - 0.3, top + 0.3], color="black", lw=2)
    ax.plot([killed_after], [top], marker="x", color=CHIEF, markersize=12, mew=3)
    ax.text(killed_after, top + 0.35, "killed", color=CHIEF, ha="center", va="bottom",
            fontsize=8)

    row = top - 1
    _bar(ax, row, restored, killed_after, REDONE)
    _bar(ax, row, killed_after, total, WORKERS[2])
    ax.text(restored, row - 0.35, f"restored step {restored}, did {killed_after - restored}"
            " steps again", ha="left", va="top", fontsize=8)
    ax.annotate("", xy=(restored, row + 0.25), xytext=(restored, top - 0.3),
                arrowprops={"arrowstyle": "->", "color": "#444444", "lw": 1.2})

    labels = ["attempt 1", "attempt 2"]
    if keras_alone:
        epoch_start = restored // per_epoch * per_epoch
        _bar(ax, 0, epoch_start, restored, CHIEF)
        _bar(ax, 0, restored, killed_after, REDONE)
        _bar(ax, 0, killed_after, total, WORKERS[2], alpha=0.35)
        ax.text(epoch_start, -0.35, f"Keras 3 alone: from batch {epoch_start + 1}; batches "
                f"{epoch_start + 1} to {restored} go into the weights twice", ha="left",
                va="top", fontsize=8)
        labels.append("Keras 3 alone")

    for edge in range(0, total + 1, per_epoch):
        ax.axvline(edge, color="#999999", lw=0.8, ls="--", zorder=0)
    ax.set_yticks(range(top, -1, -1), labels)
    ax.set_ylim(-0.9, top + 0.7)
    ax.set_xlim(0, total + 1)
    ax.set_xlabel(f"the job's batches in order, = global step (dashed: epoch ends, every "
                  f"{per_epoch})")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    plt.close(fig)          # shown once, as the returned value, not again by pyplot
    return fig


def loss_curves(runs: Mapping[str, Sequence[Mapping[str, float]]], marks: Mapping[str, int],
                *, x: str = "iteration", ylabel: str = "loss") -> Figure:
    """Each run's loss against the global step, and a dashed line at each marked step.

    ``runs`` maps a label to the records of a run's ``STEP`` lines (dicts with the key ``x``,
    the global step, and ``"loss"``); ``marks`` maps a label to a global step (the kill, the
    restored backup). The figure is closed in pyplot: the notebook shows it once, as the
    value it returns.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    for (label, records), color in zip(runs.items(), (WORKERS[0], WORKERS[2]), strict=False):
        ax.plot([r[x] for r in records], [r["loss"] for r in records], label=label, color=color)
    for (label, step), color in zip(marks.items(), (CHIEF, "#7f7f7f"), strict=False):
        ax.axvline(step, color=color, linestyle="--", label=label)
    ax.set_xlabel("global step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig
