"""The status display of ``%workers``: plain text headless, an HTML table in JupyterLab."""

from __future__ import annotations

import html
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .proctree import signal_of

if TYPE_CHECKING:
    from .taskrun import TaskRun

Row = tuple[str | int, ...]

COLORS = {"ready": "#2e7d32", "running": "#2e7d32", "starting": "#f9a825",
          "done": "#1565c0", "failed": "#c62828", "killed": "#c62828"}


def exit_text(returncode: int | None) -> str:
    """The exit column: '', '0', '3', 'SIGKILL'."""
    if returncode is None:
        return ""
    sig = signal_of(returncode) if returncode < 0 else None
    return sig.name if sig else str(returncode)


def row(run: TaskRun, gpus: bool = False) -> Row:
    try:  # short paths keep the table readable
        log = os.path.relpath(run.log_path)
    except ValueError:
        log = str(run.log_path)
    cells: list[str | int] = [str(run.task), run.process.label, run.state, exit_text(run.returncode),
             f"{run.uptime:.1f}s", run.port, log, run.activity or run.last_line()]
    if gpus:
        cells.insert(6, "none" if run.gpus == "" else (run.gpus or ""))
    return tuple(cells)


class StatusTable:
    """One row per task: task, pid, state, exit, uptime, port, (gpus,) log, last log line.
    The gpus column is there when the cluster gives tasks GPUs of their own."""

    COLUMNS = ("task", "pid", "state", "exit", "uptime", "port", "log", "last log line")

    def __init__(self, runs: Iterable[TaskRun]) -> None:
        runs = list(runs)
        gpus = any(r.gpus is not None for r in runs)
        self.columns: tuple[str, ...] = (self.COLUMNS[:6] + ("gpus",) + self.COLUMNS[6:] if gpus
                                         else self.COLUMNS)
        self.rows = [row(r, gpus) for r in runs]

    def __repr__(self) -> str:
        if not self.rows:
            return "no tasks have been launched in this kernel"
        table = [self.columns] + [tuple(str(c) for c in r) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self.columns) - 1)]
        out = []
        for r in table:
            cells = [r[i].ljust(widths[i]) for i in range(len(widths))] + [r[-1][:80]]
            out.append("  ".join(cells).rstrip())
        return "\n".join(out)

    def _repr_html_(self) -> str:
        if not self.rows:
            return "<p>No tasks have been launched in this kernel.</p>"
        head = "".join(f"<th>{c}</th>" for c in self.columns)
        log, last = self.columns.index("log"), self.columns.index("last log line")
        body = ""
        for r in self.rows:
            cells = [html.escape(str(c)) for c in r]
            cells[2] = f'<b style="color:{COLORS.get(str(r[2]), "inherit")}">{cells[2]}</b>'
            cells[log] = f"<code>{cells[log]}</code>"
            cells[last] = f"<code>{cells[last][:120]}</code>"
            body += "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

