"""Supervision: run a cluster's tasks together, and restart them all after a fault.

This is how MultiWorkerMirroredStrategy jobs recover with BackupAndRestore
or a CheckpointManager: when one task dies, its peers cannot go on, so every
task is ended and every task restarted.  Whether to restart is decided by
the root cause, the first task to die (see :func:`mwhelpers.failures.classify`):
a fault (a signal, a lost peer, TensorFlow's preemption exit code 143) is
restarted; a program error (an uncaught exception, a plain non-zero exit) is
not, because it would fail the same way again.

Each attempt's tasks get ``MWHELPERS_ATTEMPT`` (1, 2, ...) in their
environment, and each failed attempt writes its root cause as JSON to
``attempt-N.root-cause.json`` in the runtime's log folder.  :func:`supervise` checks its
arguments once (the requests, the faults to inject, a :class:`RestartPolicy`) and hands them
to a :class:`Supervision`, the one object that runs the attempts; it returns one
:class:`Attempt` per attempt.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .cluster import Task
from .errors import UsageError
from .failures import Failure, WorkerFailed, explained, report
from .job import Job, Jobs, diagnose_root
from .launchoptions import TaskOptions
from .proctree import parse_signal
from .taskrun import LaunchRequest, Standby, TaskRun, parse_timeout

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a dependency there (pyproject.toml)
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from .cluster import Cluster

# A fault to inject: (task, regex) or (task, regex, signal); see :func:`supervise`.
Fault = tuple[str | int | Task, str] | tuple[str | int | Task, str, int | str | signal.Signals]
# A fault once checked: its task, its regex compiled, its signal.
_Checked = tuple[Task, re.Pattern[str], signal.Signals]


class Host(Protocol):
    """What supervision uses of the runtime it runs under (its public API)."""

    echo: Callable[[str], None]
    jobs: Jobs
    cluster: Cluster | None

    @property
    def log_dir(self) -> Path: ...

    def define_cluster(self) -> Cluster: ...


@dataclass
class Attempt:
    """One attempt of a supervised job: its ``runs``, the faults injected (``events``), the
    tasks that failed with their outcomes in the order they died (``failed``), the
    ``root_cause`` (the first failure, or None) with its ``diagnosis`` (what it means and
    what to do, when recognised: :mod:`mwhelpers.diagnosis`) and ``root_cause_file``, and
    whether it was ``restarted`` and ``why``."""

    attempt: int
    runs: list[TaskRun]
    events: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    root_cause: Failure | None = None
    diagnosis: list[dict[str, str]] = field(default_factory=list)
    restarted: bool = False
    why: str = ""
    root_cause_file: Path | None = None


def _start(job: Job, requests: Sequence[LaunchRequest],
           standbys: dict[Task, Standby]) -> list[TaskRun]:
    """Start every task of an attempt at once (releasing the ``standbys`` started ahead for
    it, which are emptied); if one cannot start, the others are ended."""
    try:
        runs = job.start(requests, look=job.attempt == 1, standbys=standbys)
    except BaseException:
        job.console.echo(f"[mwhelpers] attempt {job.attempt} could not start every task; the ones "
                      "started were ended")
        raise
    finally:
        released = {r.process for r in job.runs}
        for standby in standbys.values():
            if standby.process not in released:
                job.spawner.discard_standby(standby)
        standbys.clear()
    for run in runs:  # ready once started: a task's peers find it through TF's own retries
        run.mark_ready()
        since = run.process.standby_since
        how = ("started" if since is None else
               f"released from its standby (started {run.process.started - since:.1f} s "
               "before to import TensorFlow)")
        job.console.echo(f"[{run.task}] {how} in the background (pid {run.pid}); log: "
                      f"{run.log_path}")
    return runs


def _start_standbys(rt: Host, job: Job, requests: Sequence[LaunchRequest],
                    tasks: Sequence[Task], attempt: int, standbys: dict[Task, Standby]) -> None:
    """The processes of ``attempt`` started ahead, one per task (where the backend can)."""
    for task, request in zip(tasks, requests, strict=True):
        try:
            standby = job.spawner.spawn_standby(task, request, attempt)
        except Exception as e:  # the attempt goes on; a restart would start this task anew
            rt.echo(f"[mwhelpers] standby: could not start {task}'s ahead ({type(e).__name__}: "
                    f"{e}); a restart starts it then")
            continue
        if standby is not None:
            standbys[task] = standby
    if standbys:
        rt.echo(f"[mwhelpers] standby: attempt {attempt}'s processes started ahead "
                f"({', '.join(str(t) for t in standbys)}), importing TensorFlow, for a restart")
    elif job.spawner.cluster.kind == "local":
        rt.echo("[mwhelpers] standby: the local backend starts no processes ahead; its warm "
                "starts skip TensorFlow's import at a restart instead")
    else:
        rt.echo("[mwhelpers] standby: this cluster's backend cannot start processes ahead; "
                "a restart starts them then")


def _root_cause_path(rt: Host, attempt: int) -> Path:
    return rt.log_dir / f"attempt-{attempt}.root-cause.json"


def _explain(rt: Host, record: Attempt, failed: list[Failure], runs: list[TaskRun]) -> None:
    """The failed attempt ``record``'s diagnosis (on its root cause and in the record), its
    root-cause file, and the diagnosis said."""
    root = failed[0]
    diagnose_root(failed, runs)
    record.diagnosis = root.diagnosis
    record.root_cause_file = root.write(_root_cause_path(rt, record.attempt))
    for line in explained(root.diagnosis):
        rt.echo(f"[mwhelpers] {line}")


def _let_peers_finish(runs: Sequence[TaskRun], codes: Container[int], grace: float) -> None:
    """When a task exited with one of ``codes`` (it stopped on purpose, having saved, as
    PreemptionCheckpointHandler makes every worker do), give the other workers up to
    ``grace`` seconds to exit the same way before they are ended: ending them at once
    would cut short the save they are finishing.  ps tasks never exit by themselves."""
    if not any(r.returncode in codes for r in runs if not r.running):
        return
    deadline = time.monotonic() + grace
    for r in runs:
        if r.running and r.task.type != "ps":
            r.wait(max(0.0, deadline - time.monotonic()))


def supervise(rt: Host, script: str | os.PathLike[str] | None = None, *,
              code: str | None = None, args: Sequence[str] = (),
              tasks: Iterable[str | int | Task] | None = None, max_restarts: int = 3,
              inject: Iterable[Fault] = (), stream: bool = True,
              restartable_exit_codes: Iterable[int] = (), peer_grace: float = 10.0,
              standby: bool = False, **options: Unpack[TaskOptions]) -> list[Attempt]:
    """Run ``rt``'s cluster tasks together; after a fault, end all and restart all.

    ``tasks`` defaults to every task of the cluster.  ``inject`` is a list of
    ``(task, regex)`` or ``(task, regex, signal)`` faults applied to the
    first attempt: the task's process tree gets ``signal`` (default SIGKILL;
    SIGTERM for a preemption drill) when its log first matches ``regex``.
    ``restartable_exit_codes`` adds exit codes to restart on (besides
    signals and 128 + signal); when a task exits with one of them, the other
    tasks get up to ``peer_grace`` seconds to exit by themselves before they
    are ended.  ``timeout`` (seconds, more than 0, as for :meth:`Runtime.launch`) bounds
    each attempt.  ``stall_fix`` and ``keras_fix`` are the launch options of the same names
    (see :meth:`Runtime.launch`).

    ``standby=True`` (the ssh and slurm backends; locally, warm starts do the same) makes
    restarts cost less than a start: once every task of an attempt
    that may be followed by a restart has imported TensorFlow, the next attempt's processes
    are started ahead (TensorFlow imported, then waiting); a restart releases them instead
    of starting new ones, saving TensorFlow's import (about 2 s).  The price: one more
    TensorFlow import per task while the attempt trains, whether or not a fault comes, and
    a program that sets variables TensorFlow reads at import (``TF_CPP_MIN_LOG_LEVEL``,
    ``KERAS_BACKEND``...) before its own ``import tensorflow`` sees them ignored in a
    restart: set them in ``env`` instead.  Standbys not needed are ended when supervision
    ends.  Every restarted task's log says it came from a standby.

    Returns the list of attempts, each an :class:`Attempt`.  Raises WorkerFailed when the root cause is a
    program error or ``max_restarts`` restarts were not enough.
    """
    policy = RestartPolicy.parse(max_restarts, restartable_exit_codes, peer_grace)
    if not isinstance(standby, bool):
        raise UsageError(f"standby must be True or False, got {standby!r}")
    attempt_timeout = parse_timeout(options.pop("timeout", None))
    cluster = rt.cluster or rt.define_cluster()
    checked = [cluster.check_task(t) for t in (tasks or cluster.tasks)]
    faults: list[_Checked] = []
    for fault in inject:
        if not isinstance(fault, (tuple, list)) or len(fault) not in (2, 3):
            raise UsageError(f"inject: each fault is (task, regex) or (task, regex, signal), got {fault!r}")
        task, pattern, sig = (*fault, signal.SIGKILL)[:3]
        try:
            faults.append((cluster.check_task(task), re.compile(pattern), parse_signal(sig)))
        except re.error as e:
            raise UsageError(f"inject: {pattern!r} is not a valid regular expression: {e}") from None
    requests = [LaunchRequest.parse(t, code=code, script=script, args=args, background=True,
                                    ready="start", **options)
                for t in checked]
    with Supervision(rt, requests, checked, policy, faults=faults, timeout=attempt_timeout,
                     stream=stream, standby=standby) as supervision:
        return supervision.run()


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed attempt is restarted: its root cause is a fault (a signal, a lost peer, or
    an exit code in ``restartable_exit_codes``) and fewer than ``max_restarts`` restarts were
    used.  A task that exits with one of those codes stopped on purpose, having saved: its
    peers get ``peer_grace`` seconds to do the same before they are ended."""

    max_restarts: int = 3
    restartable_exit_codes: tuple[int, ...] = ()
    peer_grace: float = 10.0

    @classmethod
    def parse(cls, max_restarts: object, restartable_exit_codes: Iterable[object],
              peer_grace: object) -> RestartPolicy:
        """The policy the user's arguments give; UsageError saying which is wrong."""
        if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
            raise UsageError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}")
        codes = tuple(restartable_exit_codes)
        if not all(isinstance(c, int) for c in codes):
            raise UsageError(f"restartable_exit_codes must be whole numbers, got {codes!r}")
        if (not isinstance(peer_grace, (int, float)) or isinstance(peer_grace, bool)
                or peer_grace < 0):
            raise UsageError(f"peer_grace must be a number of seconds >= 0, got {peer_grace!r}")
        return cls(max_restarts, codes, float(peer_grace))  # type: ignore[arg-type]  # checked

    def restarts(self, attempt: int, root: Failure) -> str | None:
        """None when attempt ``attempt``, failed with ``root`` first, is restarted; else why
        not, as the attempt's record says it."""
        if not root.is_fault:
            return f"not restarted: {root.reason}"
        if attempt > self.max_restarts:
            return f"not restarted: no restarts left ({self.max_restarts} used)"
        return None


class Supervision:
    """One supervised job: its requests, parsed once, run as attempt after attempt down the
    launch path (a :class:`~mwhelpers.job.Job` each) until every task finished or the
    :class:`RestartPolicy` says no more; the faults to inject into the first attempt; the
    next attempt's processes started ahead (``standby``), which :meth:`close` ends when
    they were not needed."""

    def __init__(self, rt: Host, requests: Sequence[LaunchRequest], tasks: Sequence[Task],
                 policy: RestartPolicy, *, faults: Sequence[_Checked] = (),
                 timeout: float | None = None, stream: bool = True,
                 standby: bool = False) -> None:
        self.rt = rt
        self.requests = requests
        self.tasks = tasks
        self.policy = policy
        self.faults = faults
        self.timeout = timeout
        self.stream = stream
        self.standby = standby
        self.attempts: list[Attempt] = []
        self._standbys: dict[Task, Standby] = {}  # the next attempt's, started ahead
        # The failed attempt a restart was decided for: its diagnosis and root-cause file are
        # made once the next attempt is launched (they read whole logs: the restart does not
        # wait for them).
        self._explain_later: tuple[Attempt, list[Failure], list[TaskRun]] | None = None

    def __enter__(self) -> Supervision:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self) -> list[Attempt]:
        """Every attempt's record; WorkerFailed when the last one failed."""
        for attempt in range(1, self.policy.max_restarts + 2):
            record = self._attempt(attempt)
            if not record.restarted:
                break
        return self.attempts

    def close(self) -> None:
        """End the standbys no restart needed."""
        spawner = self.rt.jobs.spawner
        if spawner is not None:
            for standby in self._standbys.values():
                spawner.discard_standby(standby)
        self._standbys.clear()

    def _attempt(self, attempt: int) -> Attempt:
        rt = self.rt
        job = rt.jobs.new(attempt, supervised=True)
        try:
            runs = _start(job, self.requests, self._standbys)
        finally:  # launched, or it could not be: the last failure is explained either way
            if self._explain_later is not None:
                _explain(rt, *self._explain_later)
                self._explain_later = None
        events: list[str] = []
        pending = list(self.faults) if attempt == 1 else []
        job.watch(runs, self.timeout, stream=self.stream,  # faults to inject: read urgently
                  on_line=self._on_line(job, attempt, events, pending), until=_attempt_over(runs),
                  urgent=bool(pending))
        for task, pattern, _ in pending:  # the task ended (or the attempt) before its line
            events.append(f"fault not injected: {task} never logged a line matching "
                          f"{pattern.pattern!r} while it ran")
            rt.echo(f"[mwhelpers] {events[-1]}")
        _let_peers_finish(runs, self.policy.restartable_exit_codes, self.policy.peer_grace)
        ended = job.end(runs, "ended by the supervisor")
        failed = job.failures(runs, self.policy.restartable_exit_codes, diagnose=False)
        record = Attempt(attempt, runs, events, [(f.task, f.outcome) for f in failed],
                         failed[0] if failed else None)
        self.attempts.append(record)
        if not failed:
            record.why = "every task finished"
            rt.echo(f"[mwhelpers] attempt {attempt}: every task finished")
            return record
        root = failed[0]
        head = f"[mwhelpers] attempt {attempt}: {root.task} {root.outcome} first; {root.reason}"
        why_not = self.policy.restarts(attempt, root)
        if why_not is not None:
            record.why = why_not
            restarts = self.policy.max_restarts
            if not root.is_fault:
                said = f"not restarted after attempt {attempt}: {root.reason}"
                decided = f"not restarting (root cause in {_root_cause_path(rt, attempt)})"
            else:
                said = f"gave up after {attempt} attempts ({restarts} restarts)"
                decided = f"no restarts left ({restarts} used)"
            rt.echo(f"{head}; {decided}")
            _explain(rt, record, failed, runs)
            raise WorkerFailed(f"{said}\n" + report(failed), failed)
        record.restarted = True
        record.why = f"restarted: {root.reason}"
        others = "ended the other tasks" if ended else "the other tasks had exited by themselves"
        rt.echo(f"{head}; {others}; restarting all {len(self.tasks)} tasks "
                f"(restart {attempt} of {self.policy.max_restarts})")
        self._explain_later = (record, failed, runs)
        return record

    def _on_line(self, job: Job, attempt: int, events: list[str], pending: list[_Checked]
                 ) -> Callable[[TaskRun, str], None]:
        """What attempt ``attempt`` does with each line of its tasks: inject the faults due
        (the first attempt only, noted in ``events``), and start the next attempt's standbys
        once every task has imported TensorFlow (its facts line, which its log feed has
        parsed: started earlier, their import would slow this attempt's own)."""
        importing = ({r.task for r in job.runs}
                     if self.standby and attempt <= self.policy.max_restarts else set())

        def on_line(run: TaskRun, line: str) -> None:
            if run.task in importing and run.feed.facts is not None:
                importing.discard(run.task)
                if not importing:
                    _start_standbys(self.rt, job, self.requests, self.tasks, attempt + 1,
                                    self._standbys)
            for fault in list(pending):
                if fault[0] == run.task and fault[1].search(line) and run.running:
                    pending.remove(fault)
                    sig = fault[2]
                    job.signal(run, sig, "fault injected by the supervisor")
                    verb = "killed" if sig == signal.SIGKILL else f"sent {sig.name} to"
                    events.append(f"fault injected: {verb} {run.task} after it logged {line!r}")
                    self.rt.echo(f"[mwhelpers] {events[-1]}")
        return on_line


def _attempt_over(runs: list[TaskRun]) -> Callable[[], bool]:
    """Whether an attempt is over: a task failed, or every worker (not ps) has ended."""
    workers = [r for r in runs if r.task.type != "ps"]
    return lambda: any(r.failed for r in runs) or all(not r.running for r in workers)
