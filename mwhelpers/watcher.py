"""Watching runs: their log lines as they are written, their readiness, and when to stop.

A :class:`Watcher` follows some task runs: it subscribes to their log feeds
(``run.feed``, :mod:`mwhelpers.follow`: each log is read once, by one follower,
whoever listens) and hands every line, from each log's start, to its listeners
(an echo into the cell, a fault injector, a pattern search) in the thread that
watches; it notes when a server task's port starts accepting connections, and
returns when every run has ended, when a condition holds, or at a deadline:

    w = Watcher(runs, probe=spawner.probe)
    w.on_line(lambda run, line: ...)
    how = w.watch(timeout=60, until=lambda: ...)   # "ended", "until" or "deadline"

:func:`await_ready` waits for one run's port alone.  Neither ends anything:
what a deadline or an interrupt means is the caller's business
(:meth:`mwhelpers.job.Job.watch` ends the stuck runs with their stacks
dumped and raises; :func:`mwhelpers.supervisor.supervise` restarts).

What a cell shows of a flood of output is bounded, as notebook front-ends
bound long outputs: :func:`echo_lines` shows each task's first lines as they
come, then keeps only its last lines, which it shows when the watch ends after
a line saying how many were left out and naming the log, which keeps every
line.  Very long lines are cut.  The bounds are a :class:`CellLimits`: a runtime's own
(``rt.cell_limits``) for the watches of its jobs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from .logs import QuietFilter

if TYPE_CHECKING:
    from .taskrun import TaskRun

SERVER_JOBS = ("chief", "worker", "ps")  # tasks that start a gRPC server on their port
POLL = 0.05  # seconds between checks of a watch's condition and deadline
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



class _Shown:
    """One run's part of a :class:`CellEcho`."""

    __slots__ = ("run", "seen", "last", "noted")

    def __init__(self, run: TaskRun, tail: int) -> None:
        self.run = run
        self.seen = 0  # lines that passed the quiet filter
        self.last: deque[str] | None = deque(maxlen=tail) if tail > 0 else None  # lines after the head
        self.noted = False  # the line saying the rest is held back was echoed


class CellEcho:
    """A line listener that echoes each run's lines within ``limits`` (see
    :class:`CellLimits`), without TensorFlow's informational lines when ``quiet``
    (:class:`~mwhelpers.logs.QuietFilter`): as ``[task] line`` to ``echo``, or, given
    ``show``, as ``show(run, line)``.  ``kept(run)`` names where every line of a run is
    kept, for the notes on what was left out (default: its log; None: nowhere, as for
    ``%%px`` output, which ipyparallel carries to the kernel, not to the log).

    :class:`Watcher` calls :meth:`finish` when its watch ends; that shows the last
    lines held back and how many were left out.  Counts are per run, from the first
    line this listener saw of it (a watch reads each log from its start).
    """

    def __init__(self, echo: Callable[[str], None] | None = None, quiet: bool = False,
                 limits: CellLimits | None = None, *,
                 show: Callable[[TaskRun, str], None] | None = None,
                 kept: Callable[[TaskRun], str | None] | None = None) -> None:
        if (echo is None) == (show is None):
            raise ValueError("give CellEcho either echo or show")
        self.echo = echo
        self._show = show
        self._kept = kept or (lambda run: str(run.log_path))
        self.quiet = quiet
        self.limits = replace(limits or CellLimits())  # a change during a watch waits for the next
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
            self._say(run, self._cut(run, line))
            return
        if not st.noted:
            st.noted = True
            later = (f"; its last {self.limits.tail:,} lines are shown when this watch ends"
                     if self.limits.tail else "")
            kept = self._kept(run)
            rest = f"goes to the log only ({kept})" if kept else "is not shown"
            self._say(run, f"... more than {head:,} lines: the rest {rest}{later}")
        if st.last is not None:
            st.last.append(line)

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
                kept = self._kept(st.run)
                self._say(st.run, f"... {n:,} lines left out"
                          + (f"; the log has every line: {kept}" if kept else ""))
            for line in st.last or ():
                self._say(st.run, self._cut(st.run, line))

    def _say(self, run: TaskRun, text: str) -> None:
        if self._show is not None:
            self._show(run, text)
        else:
            assert self.echo is not None  # one of them is given
            self.echo(f"[{run.task}] {text}")

    def _cut(self, run: TaskRun, line: str) -> str:
        width = self.limits.width
        if width is not None and len(line) > width:
            where = " in the log" if self._kept(run) else ""
            line = f"{line[:width]} ... [{len(line) - width:,} more characters{where}]"
        return line


def echo_lines(echo: Callable[[str], None], quiet: bool = False,
               limits: CellLimits | None = None) -> CellEcho:
    """A listener that echoes each line as ``[task] line`` (without TensorFlow's
    informational lines when ``quiet``: :class:`~mwhelpers.logs.QuietFilter`), each
    run's output bounded by ``limits`` (default: :class:`CellLimits`' defaults): see
    :class:`CellEcho`."""
    return CellEcho(echo, quiet, limits)


class Watcher:
    """Follows ``runs`` (see the module's text); ``probe(run)`` says whether a run's
    port accepts connections (None: readiness is not noted).  It subscribes to the runs'
    feeds when it is made and unsubscribes when its watch ends (or at :meth:`close`):
    one watcher, one watch."""

    def __init__(self, runs: Iterable[TaskRun], probe: Probe | None = None,
                 urgent: bool = False) -> None:
        self.runs = list(runs)
        self.probe = probe
        self._listeners: list[LineListener] = []
        # Lines the feeds handed over, shown in the watching thread; set when lines arrive
        # or a run exits, so that the watch wakes at once instead of at its next check (a
        # death is noticed, and a supervised restart begins, without waiting).
        self._arrived: deque[tuple[TaskRun, list[str]]] = deque()
        self._wake = threading.Event()
        for r in self.runs:
            r.process.on_exit(lambda _process: self._wake.set())
        # From each log's start: what was read before this watch is read again, once.
        # ``urgent``: a fault waits for a line (the feeds are read every follow.URGENT).
        self._unsubscribe = [r.feed.subscribe(partial(self._lines, r), replay=True, hurry=True,
                                              urgent=urgent)
                             for r in self.runs]

    def _lines(self, run: TaskRun, lines: list[str]) -> None:
        self._arrived.append((run, lines))
        self._wake.set()

    def on_line(self, fn: LineListener) -> Watcher:
        """Call ``fn(run, line)`` for every new line of every run; returns the watcher."""
        self._listeners.append(fn)
        return self

    def poll(self, final: bool = False) -> None:
        """Hand the lines that arrived since the last poll to the listeners; ``final``: read
        each log to its end first (the runs have ended)."""
        if final:
            for r in self.runs:
                r.feed.read(final=True)
        while self._arrived:
            run, lines = self._arrived.popleft()
            for line in lines:
                for fn in self._listeners:
                    fn(run, line)

    def close(self) -> None:
        """Stop following (a watch does when it ends); lines not polled yet are dropped."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._arrived.clear()

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
            self.close()
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
            self._wake.clear()  # what arrives from now on wakes the wait below
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
            self._wake.wait(POLL)


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
