"""A live view of background tasks in the notebook, updating by itself.

``%worker ... --bg`` shows one of these under its cell.  While the task runs,
a daemon thread updates it in place about once a second (an IPython display
with a ``display_id``: JupyterLab replaces the output, the kernel stays free for
other cells): its state, how long it has run, the Keras epoch and step its log
shows (for an interactive task, its cell: ``cell 3 running``), and its latest line.
Both come from what the run's log feed has read (``run.feed``, :mod:`mwhelpers.follow`):
a view reads no log.
When the task ends the view settles on the exit and the duration, and the thread
stops once no view has anything left to
follow: nothing polls while nothing runs.

Headless runs (papermill, nbclient) record what a display holds when a cell
runs: ``%waitworkers`` refreshes every view from the kernel's own thread, so
the saved notebook shows the final state.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .logs import QuietFilter
from .status import COLORS, exit_text

if TYPE_CHECKING:
    from .taskrun import TaskRun

INTERVAL = 1.0  # seconds between updates
__all__ = ["LiveViews", "TaskView", "last_shown_line"]


def last_shown_line(lines: Iterable[str]) -> str:
    """The latest line a quiet cell would show (TF's informational lines skipped)."""
    f = QuietFilter()
    shown = [ln for ln in lines if f.keep(ln) and ln.strip()]
    return shown[-1] if shown else ""


class TaskView:
    """What one background task looks like now: text headless, a table row in JupyterLab."""

    def __init__(self, run: TaskRun) -> None:
        self.task = str(run.task)
        self.state = run.state
        self.seconds = run.uptime
        self.exit = exit_text(run.returncode)
        if not run.running:  # its last lines, read now rather than at the follower's next read
            run.feed.read(final=True)
        self.progress = run.activity or run.feed.progress()  # an interactive task's cell
        self.last = last_shown_line(run.feed.recent())
        self.where = run.process.label
        self.running = run.running

    def __repr__(self) -> str:
        head = f"[{self.task}] {self.state}"
        if self.running:
            head += f" for {self.seconds:.0f} s"
        else:
            head += f" (exit {self.exit}) after {self.seconds:.1f} s"
        if self.progress:
            head += f"; {self.progress}"
        return head + (f"; last line: {self.last[:120]}" if self.last else "")

    def _repr_html_(self) -> str:
        color = COLORS.get(self.state, "inherit")
        time_text = f"{self.seconds:.0f} s" if self.running else f"{self.seconds:.1f} s"
        exit_cell = "" if self.running else f"exit {html.escape(self.exit)}"
        return (
            '<table class="mwhelpers-live"><tr>'
            f"<td><b>{html.escape(self.task)}</b></td>"
            f'<td><b style="color:{color}">{html.escape(self.state)}</b></td>'
            f"<td>{time_text}</td><td>{exit_cell}</td>"
            f"<td>{html.escape(self.progress)}</td>"
            f"<td><code>{html.escape(self.last[:160])}</code></td>"
            f"<td><small>pid {html.escape(self.where)}</small></td></tr></table>"
        )


class LiveViews:
    """The live views of one kernel, and the thread that updates them."""

    def __init__(self, display: Callable[[TaskView], Any] | None = None,
                 interval: float = INTERVAL) -> None:
        self._display = display  # shows a view and returns its handle (default: IPython's)
        self.interval = interval
        self._views: list[list[Any]] = []  # [run, its display handle, settled]
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _handle(self, obj: TaskView) -> Any:
        if self._display is not None:
            return self._display(obj)
        from IPython.display import display

        return display(obj, display_id=True)

    def show(self, run: TaskRun) -> Any:
        """Show a live view of ``run`` under the current cell and keep it updated."""
        handle = self._handle(TaskView(run))
        with self._lock:
            self._views.append([run, handle, not run.running])
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="mwhelpers-live")
                self._thread.start()
        return handle

    def refresh(self, _from_loop: bool = False) -> bool:
        """Update every view that is not settled yet; a view settles once its task ended.
        Returns whether any view is left to follow."""
        with self._lock:
            views = [v for v in self._views if not v[2]]
        for view in views:
            run, handle = view[0], view[1]
            # Read before the view is drawn: a task that ends between the two would settle
            # showing "running" for good.
            ended = not run.running
            if handle is not None:
                handle.update(TaskView(run))
            if ended:
                view[2] = True
        with self._lock:
            self._views = [v for v in self._views if not v[2]]
            if _from_loop and not self._views:
                self._thread = None  # decided under the lock: a new show() starts a new thread
            return bool(self._views)

    def stop(self) -> None:
        """Update every view once more and stop following them (the extension is unloaded)."""
        try:
            self.refresh()
        except Exception:  # a closed kernel channel: nothing to update
            pass
        with self._lock:
            self._views = []

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                if not self.refresh(_from_loop=True):
                    return
            except Exception:  # a closed kernel channel: stop quietly
                with self._lock:
                    self._thread = None
                return

    @property
    def following(self) -> int:
        """How many views are still being updated."""
        with self._lock:
            return len(self._views)
