"""How long a worker took to start, against fixed sleeps (notebook 03)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .style import CHIEF, WORKERS

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def sleep_race(ready: float, sleeps: Sequence[float] = (0.5, 10.0)) -> Figure:
    """A bar from the launch to the moment the worker said it waits for its peers (``ready``
    seconds, as measured), with a dashed line at each fixed sleep: a sleep left of the bar's
    end was too short, one right of it wasted the difference."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.6))
    ax.barh(0, ready, color=WORKERS[0], alpha=0.6)
    ax.text(ready / 2, 0, f"worker 0 starting: {ready:.1f} s", ha="center", va="center")
    for at in sleeps:
        verdict = "too short" if at < ready else f"{at - ready:.1f} s wasted"
        ax.axvline(at, color=CHIEF, linestyle="--")
        ax.text(at + 0.15, 0.45, f"sleep({at:g}):\n{verdict}", fontsize=8, va="top")
    ax.set_yticks([])
    ax.set_xlabel("seconds after the %%bash --bg cell")
    ax.set_xlim(0, max(max(sleeps) + 2, ready + 1))
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value, not again by pyplot
    return fig
