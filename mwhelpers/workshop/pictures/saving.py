"""Notebook 05's picture: which worker wrote which file, and which files are left."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from .style import CHIEF, IDLE, WORKERS, arrow, box, canvas, shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The colour of a file still on disk.
KEPT = "#d9f0d3"


def is_kept(path: str, on_disk: Collection[str]) -> bool:
    """Whether ``path`` is on disk: the file itself, or a checkpoint whose files start with it."""
    return any(p == path or p.startswith(path + ".") for p in on_disk)


def who_wrote_where(wrote: Mapping[str, tuple[bool, Sequence[str]]],
                    on_disk: Collection[str]) -> Figure:
    """Each task, whether it is the chief, and an arrow to every path it saved to.

    ``wrote[task]`` is ``(is_chief, paths)`` from the task's own report; ``on_disk`` lists the
    files there now. A path still on disk is green; a path its writer deleted is grey and dashed.
    """
    paths = [p for _, written in wrote.values() for p in written]
    height = 0.6 + 1.0 * max(len(paths), 2 * len(wrote))
    fig, ax = canvas(11, height, inches=0.85)
    top = height - 0.6
    for k, path in enumerate(paths):
        y = top - k * 1.0
        kept = is_kept(path, on_disk)
        box(ax, 4.4, y - 0.3, 6.4, 0.6, path + ("" if kept else "   (deleted by its writer)"),
            color=KEPT if kept else IDLE, fontsize=8)
    for w, (task, (chief, written)) in enumerate(wrote.items()):
        y = top - 0.5 - w * 2.0
        box(ax, 0.2, y - 0.4, 2.6, 0.8, f"{task}\n{'the chief' if chief else 'not the chief'}",
            color=CHIEF if chief else WORKERS[w % len(WORKERS)], alpha=0.35)
        for path in written:
            arrow(ax, (2.8, y), (4.4, top - paths.index(path) * 1.0))
    return shown_once(fig)
