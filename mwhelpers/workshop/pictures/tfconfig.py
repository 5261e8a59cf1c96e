"""A cluster of workers and the ``TF_CONFIG`` each one gets (notebook 03)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .style import CHIEF, WORKERS, arrow, box, canvas

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def cluster(configs: Sequence[Mapping[str, Any]]) -> Figure:
    """One box per worker process: its task, the address it listens on and the ``task`` part
    of its own ``TF_CONFIG``; below, the ``cluster`` part that every worker shares. Arrows
    between neighbours stand for the gradients the workers all-reduce with each other."""
    n = len(configs)
    width = 4.6 * n
    fig, ax = canvas(width, 3.0, inches=0.95)
    for i, config in enumerate(configs):
        task = config["task"]
        index = int(task["index"])
        address = config["cluster"][task["type"]][index]
        chief = task["type"] == "chief" or (task["type"] == "worker" and index == 0)
        x = 0.2 + 4.6 * i
        box(ax, x, 0.9, 3.6, 1.8, "", color=WORKERS[i % len(WORKERS)], alpha=0.25)
        role = " (chief)" if chief else ""
        ax.text(x + 1.8, 2.3, f"{task['type']}:{index}{role}", ha="center", weight="bold",
                color=CHIEF if chief else "black")
        ax.text(x + 1.8, 1.75, f"listens on {address}", ha="center", fontsize=9)
        ax.text(x + 1.8, 1.2, "task: " + json.dumps(task), ha="center", fontsize=7.5,
                family="monospace")
        if i + 1 < n:
            arrow(ax, (x + 3.65, 1.8), (x + 4.75, 1.8))
            arrow(ax, (x + 4.75, 1.6), (x + 3.65, 1.6))
            ax.text(x + 4.2, 2.0, "gradients\n(all-reduce)", ha="center", fontsize=7)
    ax.text(width / 2, 0.35, "every worker: cluster = " + json.dumps(configs[0]["cluster"]),
            ha="center", fontsize=7.5, family="monospace")
    import matplotlib.pyplot as plt

    plt.close(fig)  # shown once, as the cell's value, not again by pyplot
    return fig
