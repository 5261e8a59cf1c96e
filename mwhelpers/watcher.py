"""Watching runs: their log lines as they are written, their readiness, and when to stop.

A :class:`Watcher` follows the logs of some task runs, hands every new line
to its listeners (an echo into the cell, a fault injector, a pattern
search), notes when a server task's port starts accepting connections, and
returns when every run has ended, when a condition holds, or at a deadline:

    w = Watcher(runs, probe=rt.probe)
    w.on_line(lambda run, line: ...)
    how = w.watch(timeout=60, until=lambda: ...)   # "ended", "until" or "deadline"

:func:`await_ready` waits for one run's port alone.  Neither ends anything:
what a deadline or an interrupt means is the caller's business
(:meth:`mwhelpers.workers.Runtime.watch` ends the stuck runs with their stacks
dumped and raises; :func:`mwhelpers.supervisor.supervise` restarts).

What a cell shows of a flood of output is bounded, as notebook front-ends
bound long outputs: :func:`echo_lines` shows each task's first lines as they
come, then keeps only its last lines, which it shows when the watch ends after
a line saying how many were left out and naming the log, which keeps every
line.  Very long lines are cut.  The bounds are :data:`cell_limits`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .logs import LogFollower, QuietFilter

if TYPE_CHECKING:
    from .taskrun import TaskRun

SERVER_JOBS = ("chief", "worker", "ps")  # tasks that start a gRPC server on their port
POLL = 0.05  # seconds between reads of the logs
READY_POLL = 0.01  # seconds between readiness probes of a task being waited for
PROBE_EVERY = 0.5  # seconds between readiness probes of runs not ready yet

# What a watcher hands each new line to: ``fn(run, line)``; what it returns is ignored.
LineListener = Callable[["TaskRun", str], object]
# Whether a run's port accepts connections.
Probe = Callable[["TaskRun"], bool]


@dataclass
class CellLimits:
    """How much of each task's output a cell shows during one watch (a foreground
    ``%%worker`` or :meth:`~mwhelpers.workers.Runtime.launch`, ``supervise(stream=True)``
    (per attempt), ``%workerlog --follow``).

    ``head``: the first lines shown as they come (None: every line, unbounded);
    ``tail``: the last lines, shown when the watch ends (normally, at its deadline or
    on an interrupt) after a line saying how many lines were left out and naming the
    log; ``width``: the characters shown of one line, the rest cut with a note of how
    many (None: whole lines).  Lines hidden as TensorFlow's informational output
    (``verbose=False``) are not counted.

    The bounds hold with ``verbose=True`` too: ``verbose`` chooses which lines are
    shown, not how many; every line is always in the task's log, which ``%workerlog``
    (``-n 0``: all of it) and ``rt.log()`` read.  To have a watch stream every line
    whole, set ``head`` and ``width`` to None.
    """

    head: int | None = 200
    tail: int = 50
    width: int | None = 2000

    def __setattr__(self, name: str, value: object) -> None:
        # Checked when set, so that a wrong value fails before anything is launched.
        least = {"head": 0, "tail": 0, "width": 1}.get(name)
        if least is not None and not (
                (value is None and name != "tail") or (isinstance(value, int) and value >= least)):
            raise ValueError(f"cell_limits.{name} must be a whole number >= {least}"
                             f"{'' if name == 'tail' else ' or None'}, not {value!r}")
        super().__setattr__(name, value)


# The bounds every new watch uses; change them in place, e.g.
# ``mwhelpers.watcher.cell_limits.head = 1000`` or ``cell_limits.head = None`` (everything).
cell_limits = CellLimits()


class _Shown:
    """One run's part of a :class:`CellEcho`."""

    __slots__ = ("run", "seen", "last", "noted")

    def __init__(self, run: TaskRun, tail: int) -> None:
        self.run = run
        self.seen = 0  # lines that passed the quiet filter
        self.last: deque[str] | None = deque(maxlen=tail) if tail > 0 else None  # lines after the head
        self.noted = False  # the line saying the rest is held back was echoed


class CellEcho:
    """A line listener that echoes each run's lines as ``[task] line`` into ``echo``
    within ``limits`` (see :class:`CellLimits`), without TensorFlow's informational
    lines when ``quiet`` (:class:`~mwhelpers.logs.QuietFilter`).

    :class:`Watcher` calls :meth:`finish` when its watch ends; that shows the last
    lines held back and how many were left out.  Counts are per run, from the first
    line this listener saw of it (a watch reads each log from its start).
    """

    def __init__(self, echo: Callable[[str], None], quiet: bool = False,
                 limits: CellLimits | None = None) -> None:
        self.echo = echo
        self.quiet = quiet
        self.limits = replace(limits or cell_limits)  # a change during a watch waits for the next
        self._filters: dict[int, QuietFilter] = {}  # id(run) -> its filter
        self._runs: dict[int, _Shown] = {}  # id(run) -> _Shown, in the order first seen

    def __call__(self, run: TaskRun, line: str) -> None:
        if self.quiet and not self._filters.setdefault(id(run), QuietFilter()).keep(line):
            return
        st = self._runs.get(id(run))
        if st is None:
            st = self._runs[id(run)] = _Shown(run, self.limits.tail)
        st.seen += 1
        head = self.limits.head
        if head is None or st.seen <= head:
            self.echo(self._line(run, line))
            return
        if not st.noted:
            st.noted = True
            later = (f"; its last {self.limits.tail:,} lines are shown when this watch ends"
                     if self.limits.tail else "")
            self.echo(f"[{run.task}] ... more than {head:,} lines: the rest goes to the log only "
                      f"({run.log_path}){later}")
        if st.last is not None:
            st.last.append(line)

    def left_out(self, run: TaskRun) -> int:
        """How many of ``run``'s lines so far are neither shown nor held to be shown."""
        st = self._runs.get(id(run))
        return 0 if st is None else self._left_out(st)

    def _left_out(self, st: _Shown) -> int:
        if self.limits.head is None:
            return 0
        return max(0, st.seen - self.limits.head - (len(st.last) if st.last is not None else 0))

    def finish(self) -> None:
        """Echo, per run, how many lines were left out (naming the log) and then the
        last lines held back; afterwards a run's next line starts a new head."""
        runs, self._runs = self._runs, {}
        for st in runs.values():
            n = self._left_out(st)
            if n:
                self.echo(f"[{st.run.task}] ... {n:,} lines left out; "
                          f"the log has every line: {st.run.log_path}")
            for line in st.last or ():
                self.echo(self._line(st.run, line))

    def _line(self, run: TaskRun, line: str) -> str:
        width = self.limits.width
        if width is not None and len(line) > width:
            line = f"{line[:width]} ... [{len(line) - width:,} more characters in the log]"
        return f"[{run.task}] {line}"


def echo_lines(echo: Callable[[str], None], quiet: bool = False,
               limits: CellLimits | None = None) -> CellEcho:
    """A listener that echoes each line as ``[task] line`` (without TensorFlow's
    informational lines when ``quiet``: :class:`~mwhelpers.logs.QuietFilter`), each
    run's output bounded by ``limits`` (default: :data:`cell_limits`): see
    :class:`CellEcho`."""
    return CellEcho(echo, quiet, limits)


class Watcher:
    """Follows ``runs`` (see the module's text); ``probe(run)`` says whether a run's
    port accepts connections (None: readiness is not noted)."""

    def __init__(self, runs: Iterable[TaskRun], probe: Probe | None = None) -> None:
        self.runs = list(runs)
        self.probe = probe
        self._followers = {id(r): LogFollower(r.log_path) for r in self.runs}
        self._listeners: list[LineListener] = []
        # Set when a run exits: the watch wakes at once instead of at its next poll, so a
        # death is noticed (and a supervised restart begins) without waiting a poll out.
        self._exited = threading.Event()
        for r in self.runs:
            r.process.on_exit(lambda _process: self._exited.set())

    def on_line(self, fn: LineListener) -> Watcher:
        """Call ``fn(run, line)`` for every new line of every run; returns the watcher."""
        self._listeners.append(fn)
        return self

    def poll(self, final: bool = False) -> None:
        """Hand the lines written since the last poll to the listeners."""
        for r in self.runs:
            for line in self._followers[id(r)].poll(final=final):
                for fn in self._listeners:
                    fn(r, line)

    def note_ready(self) -> None:
        """Mark the server runs whose port now accepts connections as ready."""
        if self.probe is None:
            return
        for r in self.runs:
            if r.ready_after is None and r.running and r.task.type in SERVER_JOBS and self.probe(r):
                r.mark_ready()

    def watch(self, timeout: float | None = None, until: Callable[[], bool] | None = None) -> str:
        """Follow until every run has ended (``"ended"``), ``until()`` is true
        (``"until"``) or ``timeout`` seconds have passed (``"deadline"``).  When it ends,
        however it ends, each listener's ``finish()``, where it has one, is called."""
        try:
            return self._watch(timeout, until)
        finally:
            # However the watch ends (an interrupt too), listeners that hold lines back
            # (CellEcho) say what they held.
            for fn in self._listeners:
                finish = getattr(fn, "finish", None)
                if finish is not None:
                    finish()

    def _watch(self, timeout: float | None, until: Callable[[], bool] | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        next_probe = 0.0
        while True:
            finished = all(not r.running for r in self.runs)
            self.poll(final=finished)
            if finished:
                return "ended"
            if until is not None and until():
                return "until"
            now = time.monotonic()
            if now >= next_probe:
                self.note_ready()
                next_probe = now + PROBE_EVERY
            if deadline is not None and now >= deadline:
                return "deadline"
            if self._exited.wait(POLL):
                self._exited.clear()


def await_ready(run: TaskRun, probe: Probe, deadline: float) -> str:
    """Probe ``run``'s port until it accepts connections (``"ready"``: the run is marked
    ready), the run ends (``"ended"``) or ``time.monotonic()`` passes ``deadline``
    (``"deadline"``)."""
    while True:
        if probe(run) and run.mark_ready():
            return "ready"
        if not run.running:
            return "ended"
        if time.monotonic() >= deadline:
            return "deadline"
        time.sleep(READY_POLL)
