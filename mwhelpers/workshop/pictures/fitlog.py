"""The path of Keras 3's logged loss under a multi-replica strategy, from each replica to the
line ``fit`` prints (notebook 03).

Drawn from the installed Keras 3.15 source: ``TensorFlowTrainer.train_step`` updates the loss
tracker, a ``Mean`` metric whose ``total`` and ``count`` are on-read variables summed across
replicas (``keras/src/metrics/metric.py``, ``add_variable``); ``_make_function`` passes each
step's per-replica logs to ``reduce_per_replica(..., reduction="auto")``, a mean across the
replicas (``keras/src/backend/tensorflow/trainer.py``); at the end of an epoch ``fit`` reads the
metrics again (``_get_metrics_result_or_logs``) and the progress bar prints those values as
they are (``keras/src/callbacks/progbar_logger.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .style import WORKERS, arrow, box, canvas

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_STEP = "#dbe9f6"
_REDUCE = "#fde2c4"
_PRINT = "#d9f0d3"


def log_path(printed: Mapping[str, float] | None = None) -> Figure:
    """Where the loss that ``fit`` logs comes from, for two workers with one replica each.

    Each replica computes the loss of its own slice of the global batch and adds it to its own
    copy of the loss tracker. Every step, the replicas' values are averaged by an all-reduce,
    so every worker's callbacks get the same step logs. At the end of an epoch the tracker's
    total and count are summed over all replicas (another all-reduce): the epoch line and
    ``history`` hold the mean over every example of the epoch, the same on every worker.
    ``printed`` (task name to the epoch loss its log printed, as a run reported it) writes
    those numbers into the last boxes.
    """
    fig, ax = canvas(11.0, 5.6, inches=0.95)
    lanes = (3.9, 2.5)  # the replica lanes' lower edges: worker 0 on top
    for i, y in enumerate(lanes):
        ax.text(0.05, y + 0.95, f"worker {i}, replica {i}", fontsize=8, weight="bold",
                color=WORKERS[i])
        box(ax, 0.05, y, 2.3, 0.8, "train_step:\nloss of this replica's\nslice of the batch",
            color=_STEP, fontsize=7.5)
        box(ax, 2.85, y, 2.5, 0.8, "loss tracker (Mean):\ntotal += loss x rows\n"
            "count += rows", color=_STEP, fontsize=7.5)
        arrow(ax, (2.35, y + 0.4), (2.85, y + 0.4))
        arrow(ax, (5.35, y + 0.4), (6.0, 3.55 if i == 0 else 3.25))
        ax.text(4.1, y - 0.2, "its own total / count", ha="center", fontsize=7, style="italic")
    box(ax, 6.0, 2.75, 2.3, 1.3, "every step:\nreduce_per_replica\nmean over replicas\n"
        "(an all-reduce)", color=_REDUCE, fontsize=7.5)
    box(ax, 8.75, 2.85, 2.15, 1.1, "step logs, the same\non every worker:\n"
        "callbacks, progress bar", color=_PRINT, fontsize=7.5)
    arrow(ax, (8.3, 3.4), (8.75, 3.4))

    box(ax, 2.85, 0.45, 3.2, 1.0, "end of the epoch: read the tracker\ntotal and count summed "
        "over\nall replicas (an all-reduce)", color=_REDUCE, fontsize=7.5)
    for y in lanes:  # both trackers' variables, read again at the epoch's end
        ax.plot([5.35, 5.65], [y + 0.12, y + 0.12], color="#444444", lw=1.0, linestyle=":")
    ax.plot([5.65, 5.65], [lanes[0] + 0.12, 1.7], color="#444444", lw=1.0, linestyle=":")
    arrow(ax, (5.65, 1.7), (5.65, 1.45))
    ax.text(5.75, 1.9, "every replica's\ntotal and count", ha="left", fontsize=7,
            style="italic")
    numbers = dict(printed or {})
    for i, y in enumerate((0.95, 0.05)):
        task = f"worker:{i}"
        line = f"loss: {numbers[task]:.4f}" if task in numbers else "loss: ..."
        box(ax, 6.9, y, 4.0, 0.75, f"{task} prints the epoch line\n{line}  (and history)",
            color=_PRINT, fontsize=7.5)
        arrow(ax, (6.05, 0.95), (6.9, y + 0.37))
    ax.text(5.5, 5.3, "fit's logged loss under MultiWorkerMirroredStrategy (Keras 3)",
            ha="center", fontsize=10, weight="bold")
    import matplotlib.pyplot as plt

    plt.close(fig)  # shown once, as the cell's value, not again by pyplot
    return fig
