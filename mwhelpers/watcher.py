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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from .logs import LogFollower, QuietFilter

SERVER_JOBS = ("chief", "worker", "ps")  # tasks that start a gRPC server on their port
POLL = 0.05  # seconds between reads of the logs
READY_POLL = 0.01  # seconds between readiness probes of a task being waited for
PROBE_EVERY = 0.5  # seconds between readiness probes of runs not ready yet


def echo_lines(echo: Callable[[str], None], quiet: bool = False):
    """A listener that echoes each line as ``[task] line`` (without TensorFlow's
    informational lines when ``quiet``: :class:`~mwhelpers.logs.QuietFilter`)."""
    filters = {}

    def listener(run, line):
        keep = filters.setdefault(run.task, QuietFilter()).keep if quiet else None
        if keep is None or keep(line):
            echo(f"[{run.task}] {line}")

    return listener


class Watcher:
    """Follows ``runs`` (see the module's text); ``probe(run)`` says whether a run's
    port accepts connections (None: readiness is not noted)."""

    def __init__(self, runs: Iterable, probe: Callable | None = None) -> None:
        self.runs = list(runs)
        self.probe = probe
        self._followers = {id(r): LogFollower(r.log_path) for r in self.runs}
        self._listeners = []

    def on_line(self, fn: Callable) -> Watcher:
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
        (``"until"``) or ``timeout`` seconds have passed (``"deadline"``)."""
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
            time.sleep(POLL)


def await_ready(run, probe: Callable, deadline: float) -> str:
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
