"""Each task's life on one time axis: launched, ready, epochs or steps, faults, exits, restarts.

Every :class:`~mwhelpers.taskrun.TaskRun` keeps its events (``run.events``):
launched, ready, the signals mwhelpers sent it and its exit are stamped when
they happen (an exit shows the exception the program raised, from the record the task wrote
of its end: :mod:`mwhelpers.exitrecord`); Keras' ``Epoch N/M`` lines and the lines that start
with the word ``step`` (a custom loop's ``step 4 loss=...``) are stamped as the run's log
feed reads them (:mod:`mwhelpers.follow`: a line's time is when it was read, within
:data:`mwhelpers.follow.INTERVAL`).  :class:`Timeline` draws the runs of
a cluster, every attempt of a supervised job included: a picture in JupyterLab
(``_repr_png_``), a PNG file with :meth:`Timeline.save`, and text with
``print``.  Drawing needs matplotlib; the events and the text do not.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import MWHelpersError
from .status import exit_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .cluster import Task
    from .taskrun import TaskRun

_ATTEMPT_COLORS = ("#9ecae1", "#a1d99b", "#fdd0a2", "#dadaeb", "#fcbba1")
# A %%px cell's strip, by how it ended (Timeline.cells).
_CELL_COLORS = {"running": "#74c476", "ok": "#31a354", "raised": "#d62728", "ended": "#fd8d3c",
                "timed out": "#fd8d3c", "interrupted": "#fd8d3c"}


class Timeline:
    """The runs of a cluster on one time axis (``rt.timeline()``, ``%workers --timeline``)."""

    def __init__(self, runs: Iterable[TaskRun], title: str = "Task timeline") -> None:
        self.runs = list(runs)
        self.title = title
        self.t0 = min((r.launched_wall for r in self.runs), default=time.time())
        self._shortest = 0.0  # the narrowest a drawn cell may be (set when drawing)

    # -- what it holds -------------------------------------------------------------------
    def tasks(self) -> list[Task]:
        """The tasks in the order they are drawn (top to bottom): chief, workers, ps,
        evaluator."""
        order = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
        return sorted({r.task for r in self.runs}, key=lambda t: (order.get(t.type, 9), t.index))

    def events(self, run: TaskRun) -> list[tuple[float, str, str]]:
        """``[(seconds since the first launch, kind, text)]`` of one run, in time order."""
        # At equal times, the exit comes last (a line read after the task had exited is
        # stamped with its exit time).
        return sorted(((at - self.t0, kind, text) for at, kind, text in list(run.events)),
                      key=lambda e: (e[0], e[1] == "exit"))

    def cells(self, run: TaskRun) -> list[tuple[int, float, float | None, str]]:
        """The interactive cells ``run`` ran (``%%px``): ``[(number, start, end or None,
        state)]`` in seconds since the first launch; state ``running`` until it ended, then
        ``ok``, ``raised``, ``ended`` (the task was ended), ``timed out`` or
        ``interrupted``."""
        spans: dict[int, list[Any]] = {}
        for t, kind, text in self.events(run):
            if kind != "cell":
                continue
            number, _, state = text.partition(" ")
            if not number.isdigit():
                continue
            if state == "started":
                spans[int(number)] = [t, None, "running"]
            elif int(number) in spans:
                spans[int(number)][1:] = [t, state]
        return [(n, start, end, state) for n, (start, end, state) in spans.items()]

    def end_of(self, run: TaskRun) -> float:
        return (run.ended_wall if run.ended_wall is not None else time.time()) - self.t0

    def __str__(self) -> str:
        if not self.runs:
            return "No task has been launched on this cluster yet."
        lines = [f"{self.title} (seconds since the first launch)"]
        for task in self.tasks():
            # Numbered in launch order: runs launched by hand are each a supervisor's attempt 1.
            for number, run in enumerate((r for r in self.runs if r.task == task), 1):
                evs = self.events(run)
                shown = [e for e in evs if e[1] != "step"]
                steps = len(evs) - len(shown)
                raised = _raised(run)
                parts = [f"{t:.1f} s {_said(kind, text)}{raised if kind == 'exit' else ''}"
                         for t, kind, text in shown]
                if steps:
                    parts.append(f"({steps} step lines)")
                label = f"run {number}" + (f" (attempt {run.attempt})" if run.attempt > 1 else "")
                lines.append(f"{str(task):>12} {label}: " + "; ".join(parts))
        return "\n".join(lines)

    __repr__ = __str__

    # -- the picture ---------------------------------------------------------------------
    def figure(self) -> Figure:
        """A matplotlib Figure of the timeline (not shown by pyplot; see :meth:`save`)."""
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise MWHelpersError(
                "drawing the timeline needs matplotlib: pip install matplotlib "
                "(print(rt.timeline()) gives it as text without)") from None
        tasks = self.tasks()
        fig = Figure(figsize=(10, 1.6 + 0.8 * max(2, len(tasks))), dpi=100)
        ax = fig.add_subplot()
        rows = {t: len(tasks) - 1 - i for i, t in enumerate(tasks)}
        end = max((self.end_of(r) for r in self.runs), default=1.0)
        attempts = sorted({r.attempt for r in self.runs})
        self._shortest = end * 0.004  # a cell of a few milliseconds still shows
        for run in self.runs:
            self._draw_run(ax, run, rows[run.task])
        ax.set_yticks(list(rows.values()), [str(t) for t in rows])
        ax.set_ylim(-0.6, len(tasks) - 0.4)
        ax.set_xlim(0, end * 1.04 + 0.1)
        ax.set_xlabel("seconds since the first launch")
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(self.title + (f" ({len(attempts)} attempts)" if len(attempts) > 1 else ""))
        self._legend(ax, attempts)
        fig.tight_layout()
        return fig

    def _draw_run(self, ax: Axes, run: TaskRun, y: int) -> None:
        color = _ATTEMPT_COLORS[(run.attempt - 1) % len(_ATTEMPT_COLORS)]
        start, stop = run.launched_wall - self.t0, self.end_of(run)
        events = self.events(run)
        ready = next((t for t, kind, _ in events if kind == "ready"), None)
        if ready is not None and ready > start:  # starting: lighter, until ready
            ax.barh(y, ready - start, left=start, height=0.5, color=color, alpha=0.45,
                    edgecolor="none")
            ax.barh(y, stop - ready, left=ready, height=0.5, color=color, edgecolor="none")
        else:
            ax.barh(y, stop - start, left=start, height=0.5, color=color, edgecolor="none")
        steps = [t for t, kind, _ in events if kind == "step"]
        if steps:  # at most about 60 step ticks per run
            every = max(1, len(steps) // 60)
            ax.plot(steps[::every], [y - 0.18] * len(steps[::every]), "|", color="#555555",
                    markersize=5)
        for n, begun, over, state in self.cells(run):  # %%px cells: a strip above the bar
            finish = stop if over is None else over
            ax.barh(y + 0.32, max(finish - begun, self._shortest), left=begun, height=0.1,
                    color=_CELL_COLORS.get(state, "#fd8d3c"), edgecolor="none")
            ax.annotate(f"c{n}", (begun, y + 0.38), fontsize=6, ha="left", va="bottom",
                        color="#444444")
        signalled = any(kind == "signal" for _, kind, _ in events)
        for t, kind, text in events:
            if kind == "epoch":
                ax.plot([t, t], [y - 0.25, y + 0.25], color="#08519c", linewidth=1.2)
                ax.annotate(f"e{text.split('/')[0]}", (t, y + 0.27), fontsize=7,
                            ha="center", va="bottom", color="#08519c")
            elif kind == "ready":
                ax.plot(t, y, marker=">", color="black", markersize=6)
            elif kind == "signal":
                ax.plot(t, y, marker="X", color="#d62728", markersize=11)
                ax.annotate(text.split(" ", 1)[0], (t, y - 0.3), fontsize=8, ha="center",
                            va="top", color="#d62728")
            elif kind == "exit":
                if signalled:  # the X and its label already say what ended it
                    ax.plot(t, y, marker="s", markersize=8, color="#d62728")
                    continue
                ok = run.returncode == 0
                ax.plot(t, y, marker="o" if ok else "s", markersize=8,
                        color="#2ca02c" if ok else "#d62728")
                ax.annotate(_short_exit(run), (t, y + 0.3), fontsize=8, ha="left",
                            va="bottom", color="#2ca02c" if ok else "#d62728")

    def _legend(self, ax: Axes, attempts: Iterable[int]) -> None:
        from matplotlib.artist import Artist
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles: list[Artist] = [Patch(color=_ATTEMPT_COLORS[(a - 1) % len(_ATTEMPT_COLORS)],
                         label=f"attempt {a}") for a in attempts]
        handles += [
            Line2D([], [], marker=">", color="black", linestyle="", label="ready (port open)"),
            Line2D([], [], color="#08519c", label="epoch starts"),
            Line2D([], [], marker="X", color="#d62728", linestyle="", label="signal sent"),
            Line2D([], [], marker="o", color="#2ca02c", linestyle="", label="exit 0"),
            Line2D([], [], marker="s", color="#d62728", linestyle="", label="failed / killed"),
        ]
        if any(self.cells(r) for r in self.runs):
            handles += [Patch(color=_CELL_COLORS["ok"], label="%%px cell ran"),
                        Patch(color=_CELL_COLORS["raised"], label="cell raised"),
                        Patch(color=_CELL_COLORS["ended"], label="cell stopped (ended, timed out)")]
        ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8,
                  frameon=False)

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def _repr_png_(self) -> bytes | None:
        return self.png() if self.runs else None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the picture as a PNG file; returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png())
        return path


def _said(kind: str, text: str) -> str:
    return {"launched": f"launched ({text})", "ready": "ready", "epoch": f"epoch {text}",
            "step": f"step {text}", "signal": f"{text.split(' ', 1)[0]} sent",
            "exit": text}.get(kind, f"{kind} {text}".strip())


def _short_exit(run: TaskRun) -> str:
    """'exit 0', 'exit 3', 'SIGKILL', 'running' (the status table's exit column, labelled),
    with the exception's name where the program raised one: 'exit 1: ValueError'."""
    code = run.returncode
    if code is None:
        return "running"
    record = run.exit_record
    raised = f": {record.name}" if record is not None and not record.exited else ""
    return (f"exit {code}" if code >= 0 else exit_text(code)) + raised


def _raised(run: TaskRun) -> str:
    """', raised ValueError: bad shapes' where its exit record names an exception, else ''."""
    record = run.exit_record
    if record is None or record.exited:
        return ""
    return f", raised {record.summary[:120]}"
