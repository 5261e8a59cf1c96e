"""What every picture shares: colours, a blank canvas, a labelled box and an arrow."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: One colour per worker (worker 0, worker 1, ...), then the chief's, the kernel's and
#: grey for what is idle, waiting or thrown away.
WORKERS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
CHIEF = "#d62728"
KERNEL = "#7f7f7f"
IDLE = "#d9d9d9"


def canvas(width: float, height: float, *, inches: float = 1.0) -> tuple[Figure, Axes]:
    """A figure with one axis spanning ``0..width`` by ``0..height``, no ticks or frame."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width * inches, height * inches))
    # Off pyplot's list at once: the notebook shows the figure the function returns, and
    # Jupyter's inline backend would show a figure still open a second time.
    plt.close(fig)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def shown_once(fig: Figure) -> Figure:
    """``fig``, closed in pyplot and returned: Jupyter shows it once, as the cell's value, and
    not a second time as a figure the cell left open (the inline backend shows those)."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return fig


def box(ax: Axes, x: float, y: float, w: float, h: float, text: str = "", *,
        color: str = IDLE, fontsize: float = 9, alpha: float = 1.0) -> None:
    """A filled rectangle with its lower-left corner at ``(x, y)`` and ``text`` centred."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#444444", alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], text: str = "", *,
          color: str = "#444444", fontsize: float = 8, head: str = "->", lw: float = 1.4,
          dashed: bool = False, offset: tuple[float, float] = (0.0, 0.08),
          ha: str = "center", va: str = "bottom", text_color: str | None = None) -> None:
    """An arrow from ``start`` to ``end`` (``head``: matplotlib's arrow style, ``"<->"`` for
    both ways), with ``text`` placed ``offset`` from its middle, in ``text_color`` (default:
    the arrow's)."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": head, "color": color, "lw": lw,
                            "ls": "--" if dashed else "-"})
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha=ha, va=va, fontsize=fontsize, color=text_color or color)
