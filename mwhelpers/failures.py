"""Failure records: what ended a task, in what order, and whether a restart can help.

A :class:`Failure` is built once, when a failed task is reported, from its
run: task, pid, exit code or signal, when it exited (stamped by the
launcher's wait thread), the record of how its program ended that the task
wrote itself (:mod:`mwhelpers.exitrecord`), its log file and the log's last lines.
:func:`report` is the one place that renders them, root cause first.

:func:`classify` decides what kind of failure the root cause is.  A *fault*
comes from outside the program (a signal: a crash, the OOM killer, a
preemption, ``%killworker``; or a lost peer: TensorFlow's
``UnavailableError`` and friends): running the same program again can
succeed, so the supervisor restarts.  A *program error* (an uncaught
``ValueError``, a ``sys.exit(3)``) would fail the same way again: the
supervisor stops and says why.  The exception comes from the task's exit record; the
log's last traceback is read only where there is no record (a program that mwhelpers did
not start, one that ended by ``os._exit``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .errors import WorkerError
from .exitrecord import ExitRecord
from .logs import TAIL, tail_lines
from .proctree import describe_exit, signal_of

if TYPE_CHECKING:
    from .taskrun import TaskRun

# What a failure is: from outside the program (a restart can help) or the program's own.
FailureKind = Literal["fault", "program error"]
FAULT: FailureKind = "fault"
PROGRAM_ERROR: FailureKind = "program error"

# Exceptions and messages that mean a peer or the cluster went away, not a bug (the supervisor's
# restart decision and the diagnosis read the same pattern).
PEER_LOST = re.compile(
    r"UnavailableError|DeadlineExceededError|AbortedError|stopped sending heartbeats"
    r"|Socket closed|Connection reset by peer|failed to connect to all addresses"
    r"|preempt|The cluster may have been shut down|CoordinationService",
    re.IGNORECASE,
)
_TRACEBACK = "Traceback (most recent call last):"


def last_exception(lines: Sequence[str]) -> str:
    """The final line of the last Python traceback in ``lines`` ('' when none)."""
    start = max((i for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)), default=None)
    if start is None:
        return ""
    # The exception line is the first unindented line after the last traceback header.
    return next((ln for ln in lines[start + 1:] if ln and not ln[0].isspace()), "")


def classify(returncode: int, log_lines: Sequence[str], note: str = "",
             restartable_exit_codes: Container[int] = (),
             record: ExitRecord | None = None) -> tuple[FailureKind, str]:
    """``(kind, reason)`` for a task that ended with ``returncode``.

    ``kind`` is :data:`FAULT` or :data:`PROGRAM_ERROR`; ``reason`` says why,
    in words a user can act on.  ``record``: how the program ended, as the task wrote it;
    when it names an exception that gave this exit code, that exception is the one read, not
    the log's text (after ``sys.exit``, what the program printed before is: the record cannot
    know it).
    """
    sig = signal_of(returncode)
    if sig is not None:
        how = describe_exit(returncode) if returncode < 0 else f"exit code {returncode} (128 + {sig.name})"
        why = f" ({note})" if note else ""
        return FAULT, f"{how}{why}: a fault from outside the program, a restart can succeed"
    if returncode in restartable_exit_codes:
        return FAULT, f"exit code {returncode} is listed as restartable"
    if record is not None and record.exit_code == returncode and not record.exited:
        exc, said = record.summary, f"{record.type}: {record.message}"
    else:
        exc = said = last_exception(log_lines)
    if exc and PEER_LOST.search(said):
        return FAULT, f"it lost a peer ({exc[:160]}): a restart can succeed"
    if exc:
        return PROGRAM_ERROR, (f"the program raised {exc[:160]}: a program error, "
                               "a restart would fail the same way")
    if any(PEER_LOST.search(ln) for ln in log_lines[-5:]):
        return FAULT, "its last log lines say it lost a peer: a restart can succeed"
    return PROGRAM_ERROR, (f"the program exited with code {returncode} without a traceback: "
                           "treated as a program error (pass restartable_exit_codes to "
                           "restart on it)")


@dataclass
class Failure:
    """One failed task: the structured record behind every failure report."""

    task: str
    pid: int
    returncode: int
    exit: str  # 'exit code 3' or 'killed by SIGKILL'
    note: str  # who ended it, when not itself
    ended_at: float  # time.time() when it exited
    uptime: float  # seconds from start to exit
    log_path: str
    tail: list[str] = field(default_factory=list)
    attempt: int = 1
    kind: FailureKind | Literal[""] = ""
    reason: str = ""
    # On the root cause: what the job's failure means and what to do, when recognised
    # ({'key', 'cause', 'advice'} dicts, see mwhelpers.diagnosis).
    diagnosis: list[dict[str, str]] = field(default_factory=list)
    # How its program ended, as the task wrote it (None: it wrote none; mwhelpers.exitrecord).
    exit_record: ExitRecord | None = None

    @classmethod
    def of(cls, run: TaskRun, restartable_exit_codes: Container[int] = ()) -> Failure:
        """The record of ``run``, which has ended."""
        code = run.returncode
        if code is None:
            raise ValueError(f"{run.task} is still running: only a run that ended has a record")
        lines = tail_lines(run.log_path, 200)
        record = run.exit_record
        kind, reason = classify(code, lines, run.note, restartable_exit_codes, record)
        return cls(task=str(run.task), pid=run.pid, returncode=code,
                   exit=describe_exit(code), note=run.note,
                   ended_at=run.ended_wall or time.time(), uptime=run.uptime,
                   log_path=str(run.log_path), tail=lines[-TAIL:], attempt=run.attempt,
                   kind=kind, reason=reason, exit_record=record)

    @property
    def outcome(self) -> str:
        return f"{self.exit} ({self.note})" if self.note else self.exit

    @property
    def exception(self) -> str:
        """The exception its program raised, from its exit record: 'ValueError: bad shapes'
        ('' when it wrote none, or ended by ``sys.exit``)."""
        record = self.exit_record
        return record.summary if record is not None and not record.exited else ""

    @property
    def is_fault(self) -> bool:
        return self.kind == FAULT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.exit_record is not None:  # (a NamedTuple: asdict keeps it one, JSON a list)
            d["exit_record"] = self.exit_record._asdict()
        d["ended_at_iso"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.ended_at)) + \
            f".{int(self.ended_at % 1 * 1000):03d}"
        return d

    def write(self, path: Path) -> Path:
        """Write the record as JSON (the root-cause file of a failed attempt)."""
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path


def in_order(runs: Iterable[TaskRun], restartable_exit_codes: Container[int] = ()) -> list[Failure]:
    """Failure records of the failed ``runs``, the first to exit (the root cause) first."""
    failed = sorted((r for r in runs if r.failed), key=lambda r: r.ended or 0.0)
    return [Failure.of(r, restartable_exit_codes) for r in failed]


def tail_text(task: object, log_path: str | Path, lines: Sequence[str]) -> str:
    if not lines:
        return f"{task}'s log {log_path} is empty."
    return f"Last lines of {task}'s log ({log_path}):\n" + "\n".join(f"  {ln}" for ln in lines)


def explained(diagnosis: Iterable[Mapping[str, str]]) -> list[str]:
    """The 'What this means / What to do' lines of diagnosis dicts (see mwhelpers.diagnosis)."""
    return [line for d in diagnosis
            for line in (f"What this means: {d['cause']}", f"What to do: {d['advice']}")]


def report(failures: Sequence[Failure]) -> str:
    """The message of a failure: root cause, then the others in exit order, then what it
    means and what to do (when recognised), then the exception it raised (from its exit
    record), then the root cause's log."""
    first = failures[0]
    msg = f"{first.task} failed: {first.outcome}"
    if len(failures) > 1:
        msg += "; then " + ", ".join(f"{f.task} ({f.outcome})" for f in failures[1:])
    return "\n".join([msg, *details(first)])


def details(first: Failure) -> list[str]:
    """What a report says of its root cause ``first`` after naming it: what it means and what
    to do (when recognised), the exception it raised, its log's last lines."""
    raised = [f"{first.task} raised {first.exception[:300]}"] if first.exception else []
    return [*explained(first.diagnosis), *raised, tail_text(first.task, first.log_path, first.tail)]


class WorkerFailed(WorkerError):
    """One or more tasks exited with a non-zero code or were killed by a signal.

    ``failures`` lists :class:`mwhelpers.failures.Failure` records (task,
    pid, exit, time, log path, log tail, kind) in the order the tasks died;
    the first one, ``root_cause``, is the root cause.  ``diagnosis`` is what the
    report explains: dicts with ``key``, ``cause`` and ``advice`` (see
    :mod:`mwhelpers.diagnosis`), empty when the failure was not recognised.
    """

    def __init__(self, message: str, failures: Iterable[Failure] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)

    @property
    def root_cause(self) -> Failure | None:
        return self.failures[0] if self.failures else None

    @property
    def diagnosis(self) -> list[dict[str, str]]:
        return self.failures[0].diagnosis if self.failures else []
