"""Jobs: the runs of one attempt, and the only thing that starts, watches, waits for and
ends them.

A :class:`Job` is given the :class:`~mwhelpers.spawner.Spawner` of its cluster, which checks
and starts its tasks, and the :class:`Jobs` it belongs to.  The tasks a notebook launches one
by one form attempt 1 of the current cluster; :func:`mwhelpers.supervisor.supervise` makes a
new job for every attempt it starts.  A launch goes one way through it: requests, checked
once (:meth:`Job.start`), spawned, watched (:meth:`Job.watch`, :meth:`Job.await_ready`), and
its outcome (:meth:`Job.failures`).

Every way a run is ended goes through :meth:`Job.end` with a
:class:`~mwhelpers.proctree.Policy`: ``NOW`` (SIGKILL), ``INTERRUPT`` (SIGTERM, then SIGKILL)
and ``GENTLE`` (SIGINT, SIGTERM, SIGKILL).  A stuck task has its Python stacks dumped into
its log first (:func:`mwhelpers.job.dump_stacks`), a step of its own.

:class:`Jobs` is a runtime's record of its jobs, oldest first: the only registry of runs;
the runtime reads its ``runs`` and ``history`` from it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import psutil

from . import failures as failure_records
from . import proctree, stacks
from .diagnosis import explain_failure
from .ending import end
from .errors import UsageError
from .failures import Failure, WorkerFailed
from .proctree import Policy
from .taskrun import LaunchRequest, Standby, TaskRun, parse_timeout
from .timeouts import not_ready_error, timeout_error
from .watcher import CellLimits, Watcher, await_ready, echo_lines

if TYPE_CHECKING:
    from .cluster import Task
    from .follow import Event
    from .spawner import Spawner

TRAINING_JOBS = ("chief", "worker")  # tasks that wait for each other (collectives)
WatchEnd = Literal["ended", "until"]


class Console(Protocol):
    """Where a job says what it does, and how much of a task's output a cell shows."""

    echo: Callable[[str], None]
    verbose: bool
    cell_limits: CellLimits


class Job:
    """The runs of attempt ``attempt``, started through ``spawner``, one of ``book``."""

    def __init__(self, spawner: Spawner, book: Jobs, attempt: int = 1,
                 supervised: bool = False) -> None:
        self.spawner = spawner
        self.book = book
        self.console: Console = book.console
        self.attempt = attempt
        self.supervised = supervised  # made by the supervisor for one of its attempts
        self.runs: list[TaskRun] = []

    def __repr__(self) -> str:
        return f"Job(attempt {self.attempt}: {', '.join(str(r.task) for r in self.runs)})"

    # -- starting ----------------------------------------------------------------------
    def start(self, requests: Sequence[LaunchRequest], look: bool = True,
              standbys: Mapping[Task, Standby] | None = None) -> list[TaskRun]:
        """Start ``requests`` back to back, all checked first, once (a bad one starts
        nothing); when one cannot be started, the ones already started are ended and the
        error raised.  ``look``: look at each program before its launch (the supervisor's
        restarts start what it looked at already).  ``standbys``: processes started ahead
        for some tasks, released instead of started.  Returns the new runs; nothing waits
        here for readiness."""
        tasks = self.spawner.check(requests, self.book.latest(), look)
        started: list[TaskRun] = []
        try:
            for task, request in zip(tasks, requests, strict=True):
                standby = (standbys or {}).get(task)
                started.append(self.spawner.spawn(task, request, self.attempt, standby))
                self.runs.append(started[-1])
        except BaseException:
            self.end(started, f"ended: attempt {self.attempt} could not start every task")
            raise
        return started

    def latest(self) -> list[TaskRun]:
        """The latest run of each task in this job."""
        return list({r.task: r for r in self.runs}.values())

    # -- following ---------------------------------------------------------------------
    def await_ready(self, run: TaskRun, timeout: float | None) -> TaskRun:
        """Wait until ``run`` is ready (its port accepts connections, or at once for a run
        ready once started), saying so; a run that fails first raises WorkerFailed, one not
        ready within ``timeout`` s (default 120) is ended and raises WorkerTimeout."""
        echo, timeout = self.console.echo, 120.0 if timeout is None else timeout
        if run.ready_mode == "start":
            run.mark_ready()
            echo(f"[{run.task}] started in the background (pid {run.pid}); log: {run.log_path}")
            return run
        echo(f"[{run.task}] starting in the background (pid {run.pid}); waiting until "
             f"{run.address} accepts connections ... log: {run.log_path}")
        how = await_ready(run, self.spawner.probe, run.started + timeout)
        if how == "ready":
            echo(f"[{run.task}] ready after {run.ready_after:.2f} s (port {run.port} is open)")
        elif how == "ended":
            if run.failed:
                self.raise_failures([run])
            echo(f"[{run.task}] ended with exit code 0 before it opened port {run.port}")
        else:
            dump_then_end([run], f"ended by mwhelpers: it did not become ready within {timeout:g} s")
            raise not_ready_error(run, timeout, self.spawner.cluster.host_of(run.task))
        return run

    def watch(self, runs: Iterable[TaskRun] | None = None, timeout: float | None = None, *,
              stream: bool = False, quiet: bool | None = None,
              on_line: Callable[[TaskRun, str], None] | None = None,
              until: Callable[[], bool] | None = None, what: str = "did not finish",
              end_on_interrupt: bool = True, urgent: bool = False) -> WatchEnd:
        """Follow ``runs`` (default: the latest of each task) until all have ended
        (``"ended"``) or ``until()`` is true (``"until"``), with a
        :class:`~mwhelpers.watcher.Watcher`.  ``stream``: echo their new lines with a task
        prefix, within the console's cell limits (without TensorFlow's informational lines
        unless ``quiet`` is False; default: ``not console.verbose``); ``on_line(run, line)`` is
        called for each line.  After ``timeout`` seconds the runs still running have their
        stacks dumped, are ended, and WorkerTimeout is raised (saying they ``what`` within
        it).  On an interrupt (Ctrl-C) the runs are ended, unless ``end_on_interrupt`` is
        False, and the interrupt is raised again.  ``urgent``: a fault waits for a line, so
        the logs are read every :data:`mwhelpers.follow.URGENT`."""
        runs = self.latest() if runs is None else list(runs)
        watcher = Watcher(runs, probe=self.spawner.probe, urgent=urgent)
        if stream:
            watcher.on_line(echo_lines(self.console.echo,
                                       not self.console.verbose if quiet is None else quiet,
                                       self.console.cell_limits))
        if on_line is not None:
            watcher.on_line(on_line)
        try:
            how = watcher.watch(timeout, until)
        except KeyboardInterrupt:
            if not end_on_interrupt:
                raise
            alive = [r for r in runs if r.running]
            self.end(alive, "ended by mwhelpers on interrupt", Policy.INTERRUPT)
            if alive:
                self.console.echo("interrupted: ended " + ", ".join(str(r.task) for r in alive))
            raise
        if how == "deadline":
            assert timeout is not None  # the watcher sets a deadline only with a timeout
            stuck = [r for r in runs if r.running]
            dump_then_end(stuck, f"ended by mwhelpers: it {what} within {timeout:g} s")
            raise timeout_error(stuck, timeout, what, list(self.book.latest().values()),
                                self.book.not_ready())
        return "ended" if how == "ended" else "until"

    def wait_for_line(self, run: TaskRun, regex: re.Pattern[str],
                      timeout: float | None, urgent: bool = False) -> str:
        """The first line of ``run``'s log that ``regex`` matches (one there already counts),
        once it is written; the run goes on.  UsageError when it ended without one;
        WorkerTimeout (the run ended) when none came within ``timeout`` s.  ``urgent``: as
        :meth:`watch`'s."""
        found = [ln for ln in run.lines() if regex.search(ln)][:1]
        if not found and run.running:
            def on_line(r: TaskRun, line: str) -> None:
                if not found and regex.search(line):
                    found.append(line)

            self.watch([run], timeout, on_line=on_line, until=lambda: bool(found),
                       what=f"never logged {regex.pattern!r}", urgent=urgent)
        if not found:
            raise UsageError(f"{run.task} ended ({run.outcome()}) without logging "
                             f"{regex.pattern!r}")
        return found[0]

    def follow(self, run: TaskRun, timeout: float | None = None) -> TaskRun:
        """Stream ``run``'s log into the caller, every line, until it ends (or ``timeout`` s
        passed, or Ctrl-C); the run goes on running."""
        until = None if timeout is None else time.monotonic() + timeout
        try:
            self.watch([run], stream=True, quiet=False, end_on_interrupt=False,
                       until=lambda: until is not None and time.monotonic() > until)
        except KeyboardInterrupt:
            self.console.echo(f"stopped following {run.task}; it is still {run.state}")
        return run

    def wait(self, timeout: float | str | None = None,
             grace_after_failure: float = 30.0, runs: Iterable[TaskRun] | None = None,
             stream: bool = False, quiet: bool | None = None) -> list[TaskRun]:
        """Wait for ``runs`` (default: the latest run of every task) to end, but the
        parameter servers (they never end by themselves).  When one fails, the others get
        ``grace_after_failure`` seconds to follow it and are then ended as stuck.
        ``stream``/``quiet``: as :meth:`watch`'s.  Raises WorkerFailed (the root cause
        first) or WorkerTimeout."""
        runs = [r for r in (self.latest() if runs is None else runs) if r.task.type != "ps"]

        def stop_when() -> bool:
            failed = [r.ended for r in runs if r.failed and r.ended is not None]
            return bool(failed) and time.monotonic() - min(failed) > grace_after_failure

        self.watch(runs, parse_timeout(timeout), until=stop_when, stream=stream, quiet=quiet)
        stuck = [r for r in runs if r.running]
        dump_then_end(stuck, f"ended by mwhelpers: {grace_after_failure:g} s after a peer failed")
        self.raise_failures(runs)
        return runs

    # -- signals and ending ----------------------------------------------------------------
    def signal(self, run: TaskRun, sig: signal.Signals, why: str, wait: bool = True) -> TaskRun:
        """Send ``sig`` to ``run``'s whole process tree (fault injection), noting ``why``;
        with SIGKILL and ``wait``, return once every process of it is gone."""
        if not run.running:
            raise UsageError(f"{run.task} is not running: it ended with {run.outcome()}")
        run.note = why
        run.mark("signal", f"{sig.name} ({why})")
        procs = run.process.send(sig)
        if wait and sig == signal.SIGKILL:
            proctree.wait_gone(procs, 5.0)
            run.wait(5)
        return run

    def end(self, runs: Iterable[TaskRun] | None = None, why: str = "",
            policy: Policy = Policy.NOW) -> list[str]:
        """End ``runs`` (default: every run of this job) that still run: :func:`end_runs`."""
        return end_runs(self.runs if runs is None else runs, why, policy)

    # -- outcome ---------------------------------------------------------------------------
    def failures(self, runs: Iterable[TaskRun] | None = None,
                 restartable_exit_codes: Iterable[int] = (), diagnose: bool = True
                 ) -> list[Failure]:
        """Failure records of the failed ``runs`` (default: the latest of each task), the
        first to die first; with ``diagnose``, the diagnosis on the first (it reads whole
        logs: the supervisor has it made once the next attempt is launched)."""
        runs = self.latest() if runs is None else list(runs)
        # A tuple: every failure is classified against all the codes (a one-shot iterable
        # passed in would be used up by the first).
        found = failure_records.in_order(runs, tuple(restartable_exit_codes))
        if found and diagnose:
            diagnose_root(found, runs)
        return found

    def raise_failures(self, runs: Iterable[TaskRun] | None = None) -> None:
        found = self.failures(runs)
        if found:
            raise WorkerFailed(failure_records.report(found), found)


def end_runs(runs: Iterable[TaskRun], why: str = "", policy: Policy = Policy.NOW,
             extra: Iterable[psutil.Process] = ()) -> list[str]:
    """End the process trees of ``runs`` that still run, all at once, through the escalation
    of ``policy``, noting ``why`` in their outcome; also the local processes ``extra``.  The
    runs' backends escalate, ``extra`` is escalated here (:func:`mwhelpers.ending.end`, the
    one way the package ends processes).  Returns lines saying what ended with which signal,
    labelled with the owning task, and what could not."""
    live = [r for r in runs if r.running]
    for r in live:
        r.note = r.note or why
    others = list(extra)
    if others:  # those a task's own ending covers are left to it (a scan of the processes)
        owned = {p.pid for r in live for p in r.process.processes()} | {os.getpid()}
        others = list({p.pid: p for p in others if p.pid not in owned}.values())
    return end([(r.process, str(r.task)) for r in live], policy, local=others)


def dump_then_end(runs: Sequence[TaskRun], why: str) -> list[str]:
    """A stuck task's end: its stacks into its log first (:func:`dump_stacks`), then ended
    ``NOW`` with ``why`` noted (:func:`end_runs`)."""
    dump_stacks(runs)
    return end_runs(runs, why, Policy.NOW)


def dump_stacks(runs: Sequence[TaskRun], within: float = 1.0) -> None:
    """Have every run write its Python stacks into its log (the step before a stuck task is
    ended), and give the dumps up to ``within`` seconds, for all at once, to begin; what each
    wrote is heard from its feed (its ``stacks`` events and the lines after them).  Those
    whose dump did not begin are asked again by signal (a thread of theirs may hold Python's
    lock, which the backend's first way needs), with as long again."""
    heard = {r: _DumpHeard(r) for r in runs}
    try:
        for r in runs:
            r.process.dump_stacks()
        waiting = _await_dumps(heard, runs, within)
        if waiting:
            for r in waiting:
                r.process.dump_stacks_by_signal()
            waiting = _await_dumps(heard, waiting, within)
        deadline = time.monotonic() + 0.2  # the rest of a dump that has begun
        while (any(h.begun and not h.ended for h in heard.values())
               and time.monotonic() < deadline):
            time.sleep(0.02)
        for r in runs:
            r.feed.read()
    finally:
        for h in heard.values():
            h.unsubscribe()
    for r, h in heard.items():  # what each wrote since it was asked: its main thread's stack, or not
        r.stacks_written = bool(stacks.main_stack(h.lines))


class _DumpHeard:
    """What a run's feed says after a stack dump was asked for: the lines from the dump's
    first header on, and whether the dump began and ended.  The follower reads the log in a
    hurry meanwhile."""

    def __init__(self, run: TaskRun) -> None:
        self.lines: list[str] = []
        self.begun = self.ended = False
        run.feed.read()  # what was written before the request is not part of its dump
        self.unsubscribe = run.feed.subscribe(self._on_lines, self._on_event, hurry=True)

    def _on_event(self, event: Event) -> None:
        if event.kind == "stacks":
            self.begun = True
        elif event.kind == "stacks-end" and self.begun:
            self.ended = True

    def _on_lines(self, lines: list[str]) -> None:
        # (called before the events of the same lines: a dump's first batch is kept whole)
        self.lines.extend(lines)


def _await_dumps(heard: Mapping[TaskRun, _DumpHeard], runs: Sequence[TaskRun],
                 within: float) -> list[TaskRun]:
    """Wait up to ``within`` seconds for each dump to begin; the runs still running whose
    dump did not (one that ended will write nothing more)."""
    deadline = time.monotonic() + within
    waiting = list(runs)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        waiting = [r for r in waiting if not heard[r].begun and r.process.running]
    return waiting


def diagnose_root(found: Sequence[Failure], runs: Sequence[TaskRun]) -> None:
    """Put on the root cause ``found[0]`` what the failure means and what to do."""
    found[0].diagnosis = [f.to_dict() for f in explain_failure(found, runs)]


class Jobs:
    """A runtime's jobs, oldest first: it makes each (for the cluster of the spawner it was
    last given), says which one watches and ends go through, and reads the runs from them."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.spawner: Spawner | None = None  # the current cluster's
        self.all: list[Job] = []
        self._current: Job | None = None

    def use(self, spawner: Spawner | None) -> None:
        """Later jobs start the tasks of ``spawner``'s cluster (None: no cluster)."""
        self.spawner, self._current = spawner, None

    def new(self, attempt: int = 1, supervised: bool = False) -> Job:
        """A new job for ``attempt`` of the current cluster's tasks; it becomes the current."""
        if self.spawner is None:
            raise UsageError("no cluster is defined (%cluster N or define_cluster defines one)")
        self._current = Job(self.spawner, self, attempt, supervised)
        self.all.append(self._current)
        return self._current

    def current(self) -> Job:
        """The job watches, signals and ends go through (attempt 1 when none was made yet)."""
        return self._current if self._current is not None else self.new(1)

    def for_launch(self) -> Job:
        """The job that tasks launched one by one join: attempt 1, until a cluster is
        defined again or a supervised run made its own."""
        current = self._current
        return current if current is not None and not current.supervised else self.new(1)

    def of_cluster(self) -> list[TaskRun]:
        """Every run of the current cluster, oldest first."""
        return [r for j in self.all if j.spawner is self.spawner for r in j.runs]

    def latest(self) -> dict[Task, TaskRun]:
        """The latest run of each task of the current cluster."""
        return {r.task: r for r in self.of_cluster()} if self.spawner is not None else {}

    def history(self) -> list[TaskRun]:
        """Every run, oldest first."""
        return [r for j in self.all for r in j.runs]

    def not_ready(self) -> list[tuple[Task, str]]:
        """(task, reason) for each chief/worker task of the current cluster that never
        became ready."""
        if self.spawner is None:
            return []
        latest, out = self.latest(), []
        for task in self.spawner.cluster.tasks:
            if task.type not in TRAINING_JOBS:
                continue
            run = latest.get(task)
            if run is None:
                out.append((task, "never launched"))
            elif run.ready_after is None and run.returncode != 0:
                out.append((task, f"{run.outcome()} before its port opened" if not run.running
                            else f"running, but port {run.port} never opened"))
        return out
