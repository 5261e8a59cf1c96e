"""Notebook 04's pictures: who received which element, FILE against DATA, DATA by replica.

The functions take what the workers printed, read back as plain dicts: ``results[w][name]``
is worker ``w``'s record of experiment ``name``, either ``{"batches": [...], "mapped": n}``
(a batch is a list of numbers; a string stands for a placeholder) or ``{"error": "..."}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .style import IDLE, WORKERS, arrow, box, canvas, shown_once

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Results = Mapping[int, Mapping[str, Mapping[str, Any]]]

#: What a cell of the grid means: no worker, worker 0 only, worker 1 only, both.
GRID_COLOURS = (IDLE, WORKERS[0], WORKERS[1], WORKERS[2])


def kept(record: Mapping[str, Any]) -> list[int]:
    """The elements a worker kept in one experiment: every number of its batches."""
    return [v for b in record.get("batches", []) if isinstance(b, list) for v in b]


def grid(results: Results, experiments: Sequence[str], size: int = 16) -> Figure:
    """One row per experiment, one column per element 0..size-1, coloured by who received it.

    A row whose experiment failed shows the error's name instead.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    rows = []
    for name in experiments:
        first, second = set(kept(results[0][name])), set(kept(results[1][name]))
        rows.append([(v in first) + 2 * (v in second) for v in range(size)])
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(experiments) + 0.8))
    ax.imshow(rows, cmap=ListedColormap(GRID_COLOURS), vmin=0, vmax=3, aspect="auto")
    ax.set_yticks(range(len(experiments)), list(experiments))
    ax.set_xticks(range(size))
    ax.set_xlabel("element")
    for row, name in enumerate(experiments):
        if "error" in results[0][name]:
            ax.text(size / 2 - 0.5, row, results[0][name]["error"], ha="center",
                    va="center", color="#c62828")
    labels = ("worker 0 only", "worker 1 only", "both workers")
    handles = [Patch(color=c, label=t) for c, t in zip(GRID_COLOURS[1:], labels, strict=True)]
    ax.legend(handles=handles, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return shown_once(fig)


def file_vs_data(results: Results, files: int = 4, per_file: int = 4) -> Figure:
    """FILE against DATA on the four files: the files each worker read, and what it kept.

    An arrow goes from a file to a worker that read it: under DATA each worker counted every
    record (``mapped``), so every file; under FILE only the files whose records it kept.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, policy in zip(axes, ("FILE", "DATA"), strict=True):
        name = f"files{files}/{policy}"
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 4.6)
        ax.axis("off")
        for f in range(files):
            first = per_file * f
            box(ax, 0.2, 3.6 - f * 1.1, 2.8, 0.8,
                f"part-{f}: records {first}-{first + per_file - 1}", fontsize=8)
        for w, y in ((0, 2.9), (1, 0.7)):
            record = results[w][name]
            mine = kept(record)
            box(ax, 6.4, y, 3.4, 1.0, f"worker {w}\nread {record['mapped']} records, "
                f"kept {len(mine)}", color=WORKERS[w], alpha=0.35, fontsize=8)
            for f in range(files):
                every = record["mapped"] == files * per_file
                if every or any(per_file * f <= v < per_file * (f + 1) for v in mine):
                    arrow(ax, (3.0, 4.0 - f * 1.1), (6.4, y + 0.5), color=WORKERS[w])
        what = ("each worker opens only its own files" if policy == "FILE"
                else "each worker reads every file and keeps half")
        ax.set_title(f"{policy}: {what}", fontsize=9)
    return shown_once(fig)


def by_replica(pieces: Mapping[int, Sequence[Sequence[Sequence[int]]]],
               global_batch: int) -> Figure:
    """DATA with several replicas per worker: each global batch cut into one piece per replica.

    ``pieces[w][step][r]`` is what replica ``r`` of worker ``w`` received at ``step``. The top
    row shows each global batch cut into pieces, coloured by the worker that kept each; below,
    each worker's replicas and the pieces they received, step by step.
    """
    workers = sorted(pieces)
    steps = len(pieces[workers[0]])
    replicas = len(pieces[workers[0]][0])
    owner: dict[tuple[int, ...], tuple[int, int]] = {}
    for w in workers:
        for step in pieces[w]:
            for r, piece in enumerate(step):
                owner[tuple(piece)] = (w, r)
    n = len(workers) * replicas
    width = 1.2 + steps * 4.4
    top = 1.7 + 1.1 * (n - 1)
    fig, ax = canvas(width, top + 1.0, inches=0.95)
    for s in range(steps):
        x0 = 1.2 + s * 4.4
        ax.text(x0 + 2.0, top + 0.45, f"global batch {s}: {global_batch} elements, "
                f"{n} pieces", ha="center", fontsize=8)
        ordered = sorted(owner.items(), key=lambda kv: kv[0])
        step_pieces = [p for p, _ in ordered if min(p) // global_batch == s]
        for k, piece in enumerate(step_pieces):
            w, _ = owner[piece]
            box(ax, x0 + k * 1.0, top - 0.4, 0.9, 0.6, str(list(piece)),
                color=WORKERS[w], alpha=0.6, fontsize=8)
    row = 0
    for w in workers:
        for r in range(replicas):
            y = top - 1.5 - row * 1.1
            ax.text(0.05, y + 0.3, f"worker {w}\nreplica {r}", fontsize=8, va="center")
            for s in range(steps):
                piece = list(pieces[w][s][r])
                box(ax, 1.2 + s * 4.4 + 1.4, y, 1.2, 0.6, str(piece),
                    color=WORKERS[w], alpha=0.6, fontsize=8)
            row += 1
    ax.set_title(f"DATA, {len(workers)} workers with {replicas} replicas each: worker w keeps "
                 f"pieces w, w+{len(workers)}, ... of each global batch", fontsize=9)
    return shown_once(fig)
