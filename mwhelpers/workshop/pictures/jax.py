"""Pictures for notebook 12, Keras 3 on JAX across processes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .style import WORKERS

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
