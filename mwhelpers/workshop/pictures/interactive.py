"""Notebook 03c's pictures: live workers that take cells, and which numbers each one got."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .style import KERNEL, WORKERS, arrow, box, canvas, shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LINK = "#333333"  # the kernel's, the controller's and the engines' links


def engines() -> Figure:
    """How ``%%px`` reaches the workers: the kernel sends a cell to ipyparallel's controller,
    which hands it to each worker's engine; the workers' own traffic (the collectives, over
    gRPC) goes straight from worker to worker."""
    fig, ax = canvas(10, 4.4, inches=0.8)
    box(ax, 0.3, 1.6, 2.4, 1.2, "this notebook's\nkernel", color=KERNEL, alpha=0.35)
    box(ax, 3.5, 1.6, 2.4, 1.2, "ipyparallel's\ncontroller", color=KERNEL, alpha=0.2)
    box(ax, 6.9, 2.9, 2.4, 1.2, "worker:0\nengine 0", color=WORKERS[0], alpha=0.35)
    box(ax, 6.9, 0.3, 2.4, 1.2, "worker:1\nengine 1", color=WORKERS[1], alpha=0.35)
    arrow(ax, (2.7, 2.2), (3.5, 2.2), "cells,\nvalues", color=LINK, head="<->", lw=1.3,
          offset=(0.0, 0.1))
    arrow(ax, (5.9, 2.5), (6.9, 3.4), color=LINK, head="<->", lw=1.3)
    arrow(ax, (5.9, 1.9), (6.9, 0.9), color=LINK, head="<->", lw=1.3)
    arrow(ax, (8.1, 2.9), (8.1, 1.5), "gRPC:\ncollectives", color="#a33333", head="<->", lw=1.3,
          dashed=True, offset=(0.9, 0.1))
    ax.set_title("%%px sends a cell to every engine; the workers talk to each other directly",
                 fontsize=10)
    return shown_once(fig)


def batches(parts: Mapping[str, Sequence[Sequence[int]]], numbers: int) -> Figure:
    """Which of ``range(numbers)`` each worker got at each step: ``parts`` maps a worker's name
    to its batches, in step order. Colour: the worker; darker: a later step."""
    fig, ax = canvas(numbers, 1.0, inches=0.5)
    for i, its_batches in enumerate(parts.values()):
        color = WORKERS[i % len(WORKERS)]
        for step, batch in enumerate(its_batches):
            for n in batch:
                box(ax, n + 0.05, 0.05, 0.85, 0.8, str(n), color=color,
                    alpha=min(1.0, 0.35 + 0.3 * step), fontsize=8)
    names = ", ".join(f"{w}: {['blue', 'orange', 'green', 'purple'][i % 4]}"
                      for i, w in enumerate(parts))
    ax.set_title(f"range({numbers}) in global batches: {names} (darker: a later step)",
                 fontsize=9)
    return shown_once(fig)
