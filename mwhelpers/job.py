"""A job: the runs of one attempt, and the only thing that starts, watches, waits for and
ends them.

A :class:`Job` is made by its host (the :class:`~mwhelpers.workers.Runtime`, through
:meth:`JobHost.new_job`) for each attempt: the tasks a notebook launches one by one
form attempt 1 of the current cluster; :func:`mwhelpers.supervisor.supervise` makes a
new job for every attempt it starts.  The host keeps the cluster, the history and the
reports; it lends the job what only it knows: how one task's process is spawned
(``spawn``), how readiness is probed, where lines are echoed.

Every way a run is ended goes through :meth:`Job.end` with a named policy (see
:data:`mwhelpers.proctree.ESCALATIONS`): ``"now"`` (SIGKILL), ``"interrupt"`` (SIGTERM,
then SIGKILL), ``"gentle"`` (SIGINT, SIGTERM, SIGKILL) and ``"stuck"`` (each task's
Python stacks dumped into its log first, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil

from . import failures as failure_records
from . import proctree
from .backends.base import end_local, end_together
from .diagnosis import explain_failure
from .errors import UsageError, WorkerFailed
from .failures import Failure
from .taskrun import LaunchRequest, Standby, TaskRun, parse_timeout
from .timeouts import timeout_error
from .watcher import CellLimits, Watcher, echo_lines

if TYPE_CHECKING:
    from .cluster import Cluster, Task

POLICIES = ("now", "interrupt", "gentle", "stuck")


class JobHost(Protocol):
    """What a job needs from the runtime that made it (and what the supervisor uses)."""

    echo: Callable[[str], None]
    verbose: bool
    cell_limits: CellLimits

    @property
    def log_dir(self) -> Path: ...

    def ensure_cluster(self) -> Cluster: ...

    def new_job(self, attempt: int = 1, supervised: bool = False) -> Job: ...

    def spawn(self, task: Task, request: LaunchRequest, attempt: int,
              standby: Standby | None = None) -> TaskRun: ...

    def spawn_standby(self, task: Task, request: LaunchRequest,
                      attempt: int) -> Standby | None: ...

    def discard_standby(self, standby: Standby) -> None: ...

    def checked_tasks(self, requests: Sequence[LaunchRequest], look: bool = True) -> list[Task]: ...

    def probe(self, run: TaskRun) -> bool: ...

    def not_ready_tasks(self) -> list[tuple[Task, str]]: ...

    def latest_runs(self) -> list[TaskRun]: ...


class Job:
    """The runs of attempt ``attempt``, started through ``host``."""

    def __init__(self, host: JobHost, attempt: int = 1) -> None:
        self.host = host
        self.attempt = attempt
        self.runs: list[TaskRun] = []
        self.supervised = False  # made by the supervisor for one of its attempts

    def __repr__(self) -> str:
        return f"Job(attempt {self.attempt}: {', '.join(str(r.task) for r in self.runs)})"

    # -- starting ----------------------------------------------------------------------
    def start(self, requests: Sequence[LaunchRequest], look: bool = True,
              standbys: Mapping[Task, Standby] | None = None) -> list[TaskRun]:
        """Start ``requests`` back to back, all checked first (a bad one starts nothing);
        when one cannot be started, the ones already started are ended and the error
        raised.  ``look``: look at each program before its launch (the supervisor's
        restarts start what it looked at already).  ``standbys``: processes started ahead
        for some tasks, released instead of started.  Returns the new runs; nothing waits
        here for readiness."""
        tasks = self.host.checked_tasks(requests, look)
        started: list[TaskRun] = []
        try:
            for task, request in zip(tasks, requests, strict=True):
                standby = (standbys or {}).get(task)
                started.append(self.host.spawn(task, request, self.attempt, standby))
                self.runs.append(started[-1])
        except BaseException:
            self.end(started, "now", f"ended: attempt {self.attempt} could not start every task")
            raise
        return started

    def latest(self) -> list[TaskRun]:
        """The latest run of each task in this job."""
        return list({r.task: r for r in self.runs}.values())

    # -- following ---------------------------------------------------------------------
    def watch(self, runs: Iterable[TaskRun] | None = None, timeout: float | None = None, *,
              stream: bool = False, quiet: bool | None = None,
              on_line: Callable[[TaskRun, str], None] | None = None,
              until: Callable[[], bool] | None = None, what: str = "did not finish",
              end_on_interrupt: bool = True) -> str:
        """Follow ``runs`` (default: the latest of each task) until all have ended
        (``"ended"``) or ``until()`` is true (``"until"``).  See
        :meth:`mwhelpers.workers.Runtime.watch`."""
        runs = self.latest() if runs is None else list(runs)
        watcher = Watcher(runs, probe=self.host.probe)
        if stream:
            watcher.on_line(echo_lines(self.host.echo,
                                       not self.host.verbose if quiet is None else quiet,
                                       self.host.cell_limits))
        if on_line is not None:
            watcher.on_line(on_line)
        try:
            how = watcher.watch(timeout, until)
        except KeyboardInterrupt:
            if not end_on_interrupt:
                raise
            alive = [r for r in runs if r.running]
            self.end(alive, "interrupt", "ended by mwhelpers on interrupt")
            if alive:
                self.host.echo("interrupted: ended " + ", ".join(str(r.task) for r in alive))
            raise
        if how == "deadline":
            assert timeout is not None  # the watcher sets a deadline only with a timeout
            stuck = [r for r in runs if r.running]
            self.end(stuck, "stuck", f"ended by mwhelpers: it {what} within {timeout:g} s")
            raise timeout_error(stuck, timeout, what, self.host.latest_runs(),
                                self.host.not_ready_tasks())
        return how

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
        self.end([r for r in runs if r.running], "stuck",
                 f"ended by mwhelpers: {grace_after_failure:g} s after a peer failed")
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

    def end(self, runs: Iterable[TaskRun] | None = None, policy: str = "now", why: str = "",
            extra: Iterable[psutil.Process] = ()) -> list[str]:
        """End the process trees of ``runs`` (default: every run of this job) that still run,
        all at once, through the escalation ``policy`` names (:data:`POLICIES`), noting
        ``why`` in their outcome; also the local processes ``extra``.  Returns lines saying
        what ended with which signal, labelled with the owning task, and what could not."""
        if policy not in POLICIES:
            raise UsageError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
        live = [r for r in (self.runs if runs is None else runs) if r.running]
        for r in live:
            r.note = r.note or why
        if policy == "stuck":
            self._dump_stacks(live)
        escalation = proctree.ESCALATIONS["now" if policy == "stuck" else policy]
        others = list(extra)
        if others:  # those a task's own ending covers are left to it (a scan of the processes)
            owned = {p.pid for r in live for p in r.process.processes()} | {os.getpid()}
            others = list({p.pid: p for p in others if p.pid not in owned}.values())
        jobs: list[Callable[[], list[str]]] = [partial(r.process.end, escalation, str(r.task))
                                               for r in live]
        if others:
            jobs.append(lambda: end_local(others, escalation)[0])
        return end_together(jobs)

    @staticmethod
    def _dump_stacks(runs: Sequence[TaskRun], within: float = 1.0) -> None:
        """Have every run write its Python stacks into its log, and give the dumps up to
        ``within`` seconds, for all at once, to land."""
        sizes: dict[TaskRun, int] = {}
        for r in runs:
            sizes[r] = r.log_path.stat().st_size if r.log_path.exists() else 0
            r.process.dump_stacks()
        deadline = time.monotonic() + within
        waiting = list(runs)
        while waiting and time.monotonic() < deadline:
            time.sleep(0.05)
            waiting = [r for r in waiting
                       if not (r.log_path.exists() and r.log_path.stat().st_size > sizes[r])]
        if len(waiting) < len(runs):
            time.sleep(0.1)  # the rest of a dump that has begun

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
            self.diagnose(found, runs)
        return found

    @staticmethod
    def diagnose(found: Sequence[Failure], runs: Sequence[TaskRun]) -> None:
        """Put on the root cause ``found[0]`` what the failure means and what to do."""
        found[0].diagnosis = [f.to_dict() for f in explain_failure(found, runs)]

    def raise_failures(self, runs: Iterable[TaskRun] | None = None) -> None:
        found = self.failures(runs)
        if found:
            raise WorkerFailed(failure_records.report(found), found)
