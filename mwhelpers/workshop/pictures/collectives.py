"""What the workers of a MultiWorkerMirroredStrategy job do together, and what they send.

Notebooks 03b and 03c. ``order`` draws the collectives of an MWMS program in the order a
program meets them; ``sent`` draws what a run measured of its gradient all-reduces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .style import IDLE, WORKERS, arrow, box, canvas, shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The collectives of an MWMS program, in program order: (what the workers do together,
#: the call that does it, where TensorFlow or Keras does it).
COLLECTIVES = (
    ("meet: wait until\nevery task\nhas connected", "MultiWorker\nMirroredStrategy()",
     "collective_all_reduce_\nstrategy.py"),
    ("broadcast:\nworker 0 sends\nfirst values", "variables made\nin strategy.scope()",
     "collective_all_reduce_\nstrategy.py"),
    ("all-reduce:\nhow many replicas\nstill have data", "next(iterator)\n(finite dataset only)",
     "input_lib.py"),
    ("all-reduce:\nthe sum of\nthe gradients", "apply_gradients\ninside strategy.run",
     "keras: tensorflow/optimizer.py"),
    ("all-reduce:\na metric's\nsum over replicas", "reading a metric\n(or strategy.reduce)",
     "values.py"),
)


def order(workers: int = 2) -> Figure:
    """The collectives of an MWMS program, left to right in the order each worker meets them.

    One lane per worker; each collective is a bar across every lane, because no worker gets
    past it until all have reached it. Under each bar: the call that runs it and where in
    TensorFlow's or Keras's source. The third and fourth repeat at every training step.
    """
    width, lane_gap = 13.0, 1.0
    top = 1.6 + lane_gap * workers
    fig, ax = canvas(width, top + 0.6, inches=0.85)
    lanes = [top - 0.7 - lane_gap * i for i in range(workers)]
    for i, y in enumerate(lanes):
        ax.plot([1.5, width - 0.2], [y, y], color=WORKERS[i % len(WORKERS)], lw=3, zorder=0)
        ax.text(1.35, y, f"worker {i}", ha="right", va="center", fontsize=10,
                color=WORKERS[i % len(WORKERS)])
    step = (width - 2.0) / len(COLLECTIVES)
    bottom = lanes[-1] - 0.45
    for k, (what, call, where) in enumerate(COLLECTIVES):
        x = 1.9 + step * k
        box(ax, x, bottom, step - 0.5, top - 0.2 - bottom, f"{k + 1}. {what}",
            color=IDLE, fontsize=8.5, alpha=0.9)
        ax.text(x + (step - 0.5) / 2, bottom - 0.15, call, ha="center", va="top",
                fontsize=8, family="monospace")
        ax.text(x + (step - 0.5) / 2, bottom - 0.85, where, ha="center", va="top",
                fontsize=6.5, color="#555555")
    every_step = (1.9 + step * 2, 1.9 + step * 4 - 0.5)
    ax.plot(every_step, [top + 0.05] * 2, color="#444444", lw=1)
    ax.text(sum(every_step) / 2, top + 0.12, "at every training step", ha="center",
            va="bottom", fontsize=9)
    arrow(ax, (0.2, top + 0.2), (1.6, top + 0.2), "program order")
    ax.set_title("The collectives of a MultiWorkerMirroredStrategy program: every worker "
                 "must reach each one", fontsize=10)
    return shown_once(fig)


def sent(kib: Mapping[str, float], all_reduces: Mapping[str, int]) -> Figure:
    """What each run's gradient all-reduces sent per step: KiB (left), how many (right).

    ``kib`` and ``all_reduces`` map a run's name to its figure, in the order to draw them.
    """
    import matplotlib.pyplot as plt

    runs: Sequence[str] = list(kib)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 2.4))
    left.barh(runs, [kib[r] for r in runs], color=WORKERS[0])
    left.set_xlabel("KiB of gradients all-reduced per step")
    right.barh(runs, [all_reduces[r] for r in runs], color=WORKERS[1])
    right.set_xlabel("gradient all-reduces per step")
    right.set_xticks(range(0, max(all_reduces.values()) + 1))
    right.set_yticks([])
    fig.tight_layout()
    return shown_once(fig)
