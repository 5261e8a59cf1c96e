"""Notebook 9's pictures: who does what under ParameterServerStrategy, and the loop's losses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .style import CHIEF, IDLE, WORKERS, arrow, box, canvas, shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PS = "#2ca02c"


def roles() -> Figure:
    """The three roles: the coordinator (chief) schedules steps on two workers; each worker
    reads the variables from the parameter server and sends its updates there."""
    fig, ax = canvas(8.0, 4.8, inches=0.95)
    box(ax, 2.2, 3.8, 2.6, 0.9, "chief:0: the coordinator\n(runs coordinator.py)",
        color=CHIEF, alpha=0.35)
    for x, color, name in ((0.1, WORKERS[0], "worker:0"), (4.7, WORKERS[1], "worker:1")):
        box(ax, x, 2.0, 2.6, 0.9, f"{name}\nruns scheduled steps", color=color, alpha=0.35)
        arrow(ax, (3.5, 3.8), (x + 1.3, 2.9), "schedule(step)", head="-|>",
              offset=(0.1, 0.0), ha="left", va="center", text_color="black")
        arrow(ax, (x + 1.3, 2.0), (3.5, 1.0), "read variables,\nsend updates", head="<|-|>",
              offset=(0.1, 0.0), ha="left", va="center", text_color="black")
    box(ax, 2.2, 0.1, 2.6, 0.9, "ps:0\nholds the variables", color=PS, alpha=0.35)
    ax.text(7.9, 0.1, "workers never wait\nfor each other", ha="right", fontsize=8,
            color="#444444", bbox={"facecolor": IDLE, "edgecolor": "none"})
    return shown_once(fig)


def losses(history: list[float], *, label: str = "ClusterCoordinator loop") -> Figure:
    """The mean training loss of each epoch of a run (``history``, epoch 1 first)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(range(1, len(history) + 1), history, marker="x", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.legend()
    return shown_once(fig)
