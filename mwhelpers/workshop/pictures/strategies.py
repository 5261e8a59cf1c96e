"""Notebook 01's pictures: one synchronous step of data parallelism, and training curves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import style
from .style import shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPLICA = "#dbe9f6"
REDUCE = "#fde2c4"


def sync_step(global_batch: int = 128) -> Figure:
    """One synchronous step with two replicas: the global batch is split in two, each
    replica computes gradients with its own full copy of the weights, the all-reduce sums
    the two gradients, and both replicas apply the same sum, so their copies stay equal."""
    half = global_batch // 2
    fig, ax = style.canvas(9.6, 6.0, inches=0.95)
    style.box(ax, 2.2, 5.1, 5.2, 0.7, f"global batch: {global_batch} examples")
    style.box(ax, 1.6, 0.3, 6.4, 0.7, "all-reduce: g = g0 + g1 (the same sum on both replicas)",
              color=REDUCE)
    for i, left in enumerate((0.3, 6.1)):
        rows = f"{i * half}-{(i + 1) * half - 1}"
        middle = left + 1.6
        style.box(ax, left, 3.9, 3.2, 0.7, f"replica {i}: examples {rows}")
        style.box(ax, left, 2.7, 3.2, 0.7, f"replica {i}: weights w (a full copy)", color=REPLICA)
        style.box(ax, left, 1.5, 3.2, 0.7, f"gradients g{i} from its {half} examples",
                  color=REPLICA)
        style.arrow(ax, (4.8, 5.1), (middle, 4.6))
        style.arrow(ax, (middle, 3.9), (middle, 3.4))
        style.arrow(ax, (middle, 2.7), (middle, 2.2))
        style.arrow(ax, (middle, 1.5), (4.8 + (i - 0.5) * 2.4, 1.0))
    style.arrow(ax, (4.1, 1.0), (3.5, 3.05), color=style.CHIEF)
    style.arrow(ax, (5.5, 1.0), (6.1, 3.05), color=style.CHIEF)
    ax.text(4.8, 3.1, "both apply\nw -= lr * g", ha="center", va="center", fontsize=9,
            color=style.CHIEF)
    return shown_once(fig)


def training_losses(curves: dict[str, list[float]]) -> Figure:
    """The training loss after each epoch, one line per run (label -> losses)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    for (label, losses), marker in zip(curves.items(), "oxsd^v", strict=False):
        ax.plot(range(1, len(losses) + 1), losses, marker=marker, label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.legend()
    fig.tight_layout()
    return shown_once(fig)


def global_batch(workers: int = 2, gpus_each: int = 2, per_replica: int = 64) -> Figure:
    """One global batch of a cluster of ``workers`` machines with ``gpus_each`` GPUs each:
    one replica per GPU, each taking ``per_replica`` examples, and each worker's part."""
    import matplotlib.pyplot as plt

    replicas = workers * gpus_each
    size = per_replica * replicas
    fig, ax = plt.subplots(figsize=(8.5, 2.0))
    for r in range(replicas):
        w, g = divmod(r, gpus_each)
        ax.barh(0, per_replica, left=r * per_replica, height=0.6, edgecolor="white",
                color=style.WORKERS[w % len(style.WORKERS)], alpha=0.45 + 0.3 * (g % 2))
        ax.text((r + 0.5) * per_replica, 0, f"worker:{w} GPU:{g}\n{per_replica} examples",
                ha="center", va="center", fontsize=8)
    for w in range(workers):
        left, width = w * gpus_each * per_replica, gpus_each * per_replica
        ax.annotate("", xy=(left + 2, 0.45), xytext=(left + width - 2, 0.45),
                    arrowprops={"arrowstyle": "<->"})
        ax.text(left + width / 2, 0.55, f"worker:{w}'s part: {width}", ha="center", fontsize=9)
    ax.set_xlim(0, size)
    ax.set_ylim(-0.4, 0.8)
    ax.set_yticks([])
    ax.set_xlabel(f"one global batch of {size} = {per_replica} per replica x {replicas} replicas")
    fig.tight_layout()
    return shown_once(fig)
