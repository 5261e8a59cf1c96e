"""Notebook 7's picture: the handshake of ``PreemptionCheckpointHandler`` on two workers.

Drawn from ``tensorflow/python/distribute/failure_handling/failure_handling.py`` (TensorFlow
2.21, no grace period, the default exit code), with the steps and exit codes of the
notebook's run written in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .style import CHIEF, KERNEL, WORKERS, arrow, box, canvas

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SERVICE = "#bcbd22"       # the coordination service (its leader: worker 0, with no chief)


def handshake(*, signalled_after: int, agreed: int, exit_codes: Sequence[int],
              restored: int) -> Figure:
    """The preemption handshake as a sequence diagram, time running down.

    Four lanes: the supervisor, worker 0 (the chief), the coordination service's key-value
    store, worker 1. The supervisor sends worker 1 SIGTERM once it has read step
    ``signalled_after`` in worker 1's log (worker 1 trains on meanwhile, a few steps at small
    sizes). Worker 1's signal handler claims the preemption in the store; at its
    next ``handler.run`` it sets the step to save at, ``agreed``, and waits until every worker
    has acknowledged it. Each worker trains up to that step, saves (the chief into
    ``checkpoint_dir``, worker 1 into ``workertemp_1``, deleted then) and exits with its code in
    ``exit_codes``. The supervisor restarts both; they restore step ``restored``.
    """
    import matplotlib.pyplot as plt

    fig, ax = canvas(10.5, 8.2, inches=0.85)
    plt.close(fig)          # shown once, as the returned value, not again by pyplot
    lanes = {"supervisor": 1.0, "worker 0 (chief)": 3.6, "coordination\nservice": 6.2,
             "worker 1": 8.8}
    colors = (KERNEL, WORKERS[0], SERVICE, WORKERS[1])
    for (name, x), color in zip(lanes.items(), colors, strict=True):
        box(ax, x - 0.8, 7.4, 1.6, 0.6, name, color=color, fontsize=8, alpha=0.6)
        ax.plot([x, x], [0.3, 7.4], color="#999999", lw=1, ls=":", zorder=0)
    sup, w0, kv, w1 = lanes.values()

    def note(x: float, y: float, text: str, color: str = "#222222") -> None:
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, color=color,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": color})

    arrow(ax, (sup, 6.9), (w1 - 0.1, 6.9),
          f"SIGTERM, once worker 1's log shows step {signalled_after} (it trains on)", color=CHIEF)
    arrow(ax, (w1, 6.4), (kv + 0.1, 6.4), "signal handler: TERMINATED_WORKER = 1")
    arrow(ax, (w1, 5.7), (kv + 0.1, 5.7), f"next handler.run: RUN_TO_CHECKPOINT = {agreed}")
    note(w1 + 0.2, 5.25, "waits for every\nworker's ack")
    arrow(ax, (kv, 4.6), (w0 + 0.1, 4.6))
    arrow(ax, (kv, 4.6), (w1 - 0.1, 4.6))
    note(kv, 4.15, f"each worker's watcher thread\nreads {agreed} and acknowledges")
    for x in (w0, w1):
        note(x, 3.6, f"trains on to\nstep {agreed}")
    note(w0, 2.75, "saves into\ncheckpoint_dir")
    note(w1, 2.75, "saves into workertemp_1,\nthen deletes it")
    for (x, y), code in zip(((w0, 2.1), (w1, 1.7)), exit_codes, strict=True):
        arrow(ax, (x, y), (sup + 0.1, y), f"exits, code {code}")
    codes = " and ".join(str(code) for code in exit_codes)
    note(sup, 1.15, f"{codes}:\nrestart both")
    for x in (w0, w1):
        note(x, 0.7, f"restart: restores\nstep {restored}", color=WORKERS[2])
    return fig
