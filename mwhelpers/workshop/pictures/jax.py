"""Pictures for notebooks 12 and 12b, Keras 3 on JAX across processes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .style import IDLE, WORKERS, box, canvas

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def job_times(table: Mapping[str, Mapping[str, float]], title: str = "") -> Figure:
    """One bar chart per measure, one bar per job: the jobs' times side by side.

    ``table`` maps a job's name to its measures (``{"job wall s": 12.3, ...}``); every job
    has the same measures, in the same order.
    """
    import matplotlib.pyplot as plt

    jobs = list(table)
    measures = list(table[jobs[0]]) if jobs else []
    fig, axes = plt.subplots(1, max(len(measures), 1), figsize=(3.4 * max(len(measures), 1), 2.6),
                             squeeze=False)
    colours = [WORKERS[i % len(WORKERS)] for i in range(len(jobs))]
    for ax, measure in zip(axes[0], measures, strict=False):
        ax.bar([job.split(" ")[0] for job in jobs], [table[job][measure] for job in jobs],
               color=colours)
        ax.set_title(measure, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    plt.close(fig)  # Jupyter shows the returned figure; closed, the inline backend does not too
    return fig


def model_split(mesh: tuple[int, int], processes: int, shards: Mapping[str, str],
                whole: Mapping[str, str], device_bytes: Mapping[str, int],
                model_bytes: int) -> Figure:
    """A device mesh of ``mesh`` (rows along ``batch``, columns along ``model``), each device
    coloured by its process (the devices in process order, as ``keras.distribution`` lists
    them) and labelled with the shard it holds of each kernel (``shards``: the shape of a
    shard, as ``"784x128"``; ``whole``: the kernel's); beside it, the bytes a device holds in
    each run (``device_bytes``: run name to bytes) against the whole model's."""
    rows, cols = mesh
    width = 1.9 * cols
    fig, ax = canvas(width + 4.4, 1.2 * rows + 0.5, inches=1.0)
    per_process = rows * cols // processes
    for r in range(rows):
        for c in range(cols):
            device = r * cols + c
            text = f"process {device // per_process}, device {device}\n" + "\n".join(
                f"{name} {_part(shape, whole[name], c)}" for name, shape in shards.items())
            box(ax, 0.4 + 1.9 * c, 0.3 + 1.2 * (rows - 1 - r), 1.7, 1.0, text,
                color=WORKERS[device // per_process % len(WORKERS)], fontsize=7, alpha=0.35)
    ax.text(0.4 + width / 2, 0.05, "model axis \u2192", ha="center", fontsize=8)
    ax.text(0.05, 0.3 + 0.6 * rows, "batch axis \u2192", rotation=270, va="center", fontsize=8)
    top = 0.3 + 1.2 * rows - 0.3
    ax.text(width + 0.7, top + 0.1, "bytes on one device", fontsize=8)
    for i, (run, held) in enumerate({**device_bytes, "the whole model": model_bytes}.items()):
        y = top - 0.45 * (i + 1)
        box(ax, width + 0.7, y, 2.6 * held / model_bytes, 0.3,
            color=IDLE if run == "the whole model" else WORKERS[i % len(WORKERS)])
        ax.text(width + 0.75, y + 0.15, f"{run}: {held / 1e6:.2f} MB", va="center", fontsize=7)
    return fig


def _part(shard: str, whole: str, column: int) -> str:
    """The slice of a kernel of shape ``whole`` that a shard of shape ``shard`` (both as
    ``"784x128"``) in mesh column ``column`` holds, as ``[:, 0:128]``."""
    parts = []
    for held, full in zip(map(int, shard.split("x")), map(int, whole.split("x")), strict=True):
        if held == full:
            parts.append(":")
        else:
            start = column % (full // held) * held
            parts.append(f"{start}:{start + held}")
    return "[" + ", ".join(parts) + "]"
