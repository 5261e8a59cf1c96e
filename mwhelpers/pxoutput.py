"""What a cell run on interactive tasks (``%%px``) shows: each task's output as it comes
(:class:`Printer`, bounded and quiet as a ``%%worker`` cell's), and each task's value of an
expression (:class:`TaskValues`)."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .ippresults import EngineCell, Execution
from .logs import shown
from .taskname import Task
from .watcher import CellEcho

if TYPE_CHECKING:
    from .taskrun import TaskRun
    from .watcher import CellLimits


class TaskValues(dict[Task, Any]):
    """Each task's value of one expression, keyed by task; a table in JupyterLab."""

    def __init__(self, expression: str, values: Mapping[Task, Any]) -> None:
        super().__init__(values)
        self.expression = expression

    def __getitem__(self, task: Task | str) -> Any:
        """A task's value, by its :class:`Task` or its name (``values["worker:1"]``)."""
        if isinstance(task, str) and not isinstance(task, tuple):
            named = {str(t): t for t in self}
            if task not in named:
                raise KeyError(f"{task!r}: no value for it; the tasks here are "
                               + ", ".join(named))
            task = named[task]
        return super().__getitem__(task)

    def __repr__(self) -> str:
        width = max([len(str(t)) for t in self] + [4])
        lines = [f"{'task':<{width}}  {self.expression}"]
        lines += [f"{str(t):<{width}}  {v!r}" for t, v in self.items()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(str(t))}</td><td><pre style='margin:0'>"
                       f"{html.escape(repr(v))}</pre></td></tr>" for t, v in self.items())
        return (f"<table><thead><tr><th>task</th><th>{html.escape(self.expression)}</th></tr>"
                f"</thead><tbody>{rows}</tbody></table>")

    def same(self) -> bool:
        """Whether every task has the same value (arrays compared element by element)."""
        values = list(self.values())
        return all(same_value(values[0], v) for v in values[1:])


def same_value(a: Any, b: Any) -> bool:
    try:
        import numpy as np
        return bool(np.array_equal(np.asarray(a, dtype=object) if isinstance(a, list) else a,
                                   np.asarray(b, dtype=object) if isinstance(b, list) else b))
    except Exception:
        return bool(a == b)


def plain(result: Any) -> Any:
    """A task's execute_result as the kernel shows it (its text)."""
    if not result:
        return None
    data = result.get("data", {})
    return data.get("text/plain")


class Printer:
    """Streams each task's output of one cell as it arrives, line by line, labelled with its
    task, as a ``%%worker`` cell shows a task's output: on stdout as ``[task] line`` through
    ``say`` (or to ``echo(task, stream, text)`` when given), without TensorFlow's and
    mwhelpers' informational lines when ``quiet`` (:class:`~mwhelpers.logs.QuietFilter`),
    within ``limits`` (:class:`~mwhelpers.watcher.CellLimits`; :meth:`finish` shows the
    last lines held back)."""

    def __init__(self, runs: Sequence[TaskRun], echo: Callable[[Task, str, str], None] | None,
                 say: Callable[[str], None] = print, quiet: bool = True,
                 limits: CellLimits | None = None) -> None:
        self.runs = list(runs)
        self.tasks = [r.task for r in self.runs]
        self._echo = echo
        self._say = say
        self._stream = "stdout"  # the stream of the line being shown (for ``echo``)
        # ipyparallel carries the output to the kernel, not to the task's log: kept nowhere
        self.cell = CellEcho(quiet=quiet, limits=limits, show=self._emit, kept=lambda run: None)
        self.partial: dict[tuple[Task, str], str] = {}
        self.lock = threading.Lock()
        self.line_lock = threading.Lock()
        self.muted = False
        self.shown: dict[tuple[Task, str], int] = {}  # how much of each output was shown
        self.shown_lock = threading.RLock()

    def _emit(self, run: TaskRun, text: str) -> None:
        if self._echo is not None:
            self._echo(run.task, self._stream, text)
        else:
            self._say(f"[{run.task}] {text}")

    def attach(self, ar: Execution) -> list[Callable[[], None]]:
        """Follow ``ar``'s output from now on, and show what came before (a fast task may
        have printed before the cell's callbacks were in place); returns what stops it."""
        stops: list[Callable[[], None]] = []
        for run, cell in zip(self.runs, ar.engines, strict=True):
            def on_message(msg: dict[str, Any], run: TaskRun = run, cell: EngineCell = cell
                           ) -> None:
                if msg["header"]["msg_type"] in ("stream", "display_data", "execute_result"):
                    self.catch_up(run, cell)
            stops.append(cell.follow(on_message))
            self.catch_up(run, cell)
        return stops

    def detach(self, ar: Execution, stops: Sequence[Callable[[], None]]) -> None:
        for stop in stops:
            stop()
        for run, cell in zip(self.runs, ar.engines, strict=True):
            self.catch_up(run, cell)

    def catch_up(self, run: TaskRun, cell: EngineCell) -> None:
        """Show what ipyparallel has gathered of ``run``'s output and was not shown yet.

        ipyparallel adds each message to the future's metadata before it calls the
        callbacks, so reading from there (not from the message) shows everything once, in
        order, whether it came before the callbacks were in place or after."""
        md = cell.output
        task = run.task
        with self.shown_lock:
            for name in ("stdout", "stderr"):
                text = md.get(name) or ""
                done = min(self.shown.get((task, name), 0), len(text))  # \r rewrites shorten it
                if len(text) > done:
                    self.shown[(task, name)] = len(text)
                    self.text(run, name, text[done:])
            outputs = md.get("outputs") or []
            for content in outputs[self.shown.get((task, "outputs"), 0):]:
                self.display(run, content)
            self.shown[(task, "outputs")] = len(outputs)
            result = md.get("execute_result")
            if result and not self.shown.get((task, "result")):
                self.shown[(task, "result")] = 1
                self.display(run, result)

    def display(self, run: TaskRun, content: Mapping[str, Any]) -> None:
        data = content.get("data", {})
        if set(data) <= {"text/plain"}:  # plain text: a line like any other, always shown
            with self.line_lock:
                self._stream = "stdout"
                self._emit(run, f"Out: {data.get('text/plain', '')}")
        else:
            show_rich(run.task, data, content.get("metadata", {}))

    def text(self, run: TaskRun, stream: str, text: str) -> None:
        with self.lock:
            key = (run.task, stream)
            text = self.partial.pop(key, "") + text.replace("\r\n", "\n")
            *complete, rest = text.split("\n")
            if rest:
                self.partial[key] = rest
        for line in complete:
            self.line(run, stream, line)

    def mute(self) -> None:
        """Show what has come so far and nothing after (a failed cell's stack dumps)."""
        self.flush()
        self.muted = True

    def line(self, run: TaskRun, stream: str, line: str) -> None:
        if self.muted:
            return
        with self.line_lock:
            self._stream = stream
            self.cell(run, shown(line))

    def flush(self) -> None:
        with self.lock:
            left, self.partial = self.partial, {}
        by_task = {r.task: r for r in self.runs}
        for (task, stream), rest in left.items():
            self.line(by_task[task], stream, rest)

    def finish(self) -> None:
        """Show the last lines held back by the bounds, and how many were left out."""
        with self.line_lock:
            self.cell.finish()


def show_rich(task: Task, data: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    """A task's rich output (a plot, a table) shown in the kernel, labelled with its task."""
    from IPython.display import publish_display_data

    print(f"[{task}]", flush=True)
    publish_display_data(dict(data), dict(metadata))
