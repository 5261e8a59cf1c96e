"""Pictures of notebook 10: what the hosts of one job need from each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .style import CHIEF, WORKERS, arrow, box, canvas, shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

SHARED = "#d9f0d3"
HOST = "#f4f4f4"


def two_hosts(port: int = 20001) -> Figure:
    """Two hosts of one job: each runs one worker whose gRPC server listens on every
    interface at ``port``; a firewall opens that port between the hosts only; both read
    the program and the backups from shared storage; both get the same ``cluster``."""
    fig, ax = canvas(12, 6, inches=0.75)
    for x, host, index in ((0.3, "host-a", 0), (7.7, "host-b", 1)):
        box(ax, x, 2.2, 4.0, 2.6, color=HOST)
        ax.text(x + 2.0, 4.45, host, ha="center", weight="bold")
        box(ax, x + 0.4, 2.6, 3.2, 1.3,
            f"worker:{index}, python main.py\nlistens on every interface,\nport {port}",
            color=WORKERS[index], fontsize=8, alpha=0.35)
    ax.add_patch(_firewall())
    ax.text(6.0, 5.25, f"firewall: port {port}\nopen between the hosts only", ha="center",
            fontsize=8, color=CHIEF)
    ax.annotate("", xy=(7.75, 3.25), xytext=(4.25, 3.25),
                arrowprops={"arrowstyle": "<->", "lw": 2})
    ax.text(6.0, 3.45, "gRPC, no\nauthentication", ha="center", fontsize=7)
    box(ax, 4.2, 0.2, 3.6, 1.1, "shared storage (NFS, gs://, s3://):\n"
        "the program, backups, checkpoints", color=SHARED, fontsize=8)
    for x in (2.3, 9.7):
        arrow(ax, (x, 2.15), (6.0 + (x - 6.0) * 0.3, 1.35), color="#2e7d32")
    ax.text(6.0, 5.75, 'TF_CONFIG on both: {"cluster": {"worker": '
            f'["host-a:{port}", "host-b:{port}"]}}, "task": ...}}',
            ha="center", fontsize=8, family="monospace")
    return shown_once(fig)


def _firewall() -> Rectangle:
    from matplotlib.patches import Rectangle

    return Rectangle((5.35, 2.0), 1.3, 3.0, facecolor="#fbe3e3", edgecolor=CHIEF,
                     hatch="//", alpha=0.6)
