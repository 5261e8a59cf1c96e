"""The reports of tasks that ran out of time: one that never became ready, or a job that
did not finish.  Each says which tasks, what their dumped stacks show (see
:mod:`mwhelpers.diagnosis`) and what each printed last before its stacks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from . import failures as failure_records
from . import stacks
from .diagnosis import explain_stuck
from .errors import WorkerTimeout
from .logs import TAIL, QuietFilter

if TYPE_CHECKING:
    from .cluster import Task
    from .taskrun import TaskRun


def tail_before_stacks(run: TaskRun) -> str:
    """The last lines a stuck task wrote before its stacks, TF's info lines left out."""
    quiet = QuietFilter()
    before = stacks.before_last_dump(run.lines())
    lines = [ln for ln in before if quiet.keep(ln)]
    if not lines:
        what = "only TensorFlow's informational lines" if before else "nothing"
        return f"{run.task} printed {what} before its stacks (log: {run.log_path})."
    return failure_records.tail_text(run.task, run.log_path, lines[-TAIL:])


def not_ready_error(run: TaskRun, timeout: float, host: str | None = None) -> WorkerTimeout:
    """The WorkerTimeout of ``run``, whose port never opened within ``timeout`` s
    (``host``: where it runs, when that is another machine)."""
    where = ""
    if host is not None:
        where = (f" from this machine at {run.address} (on {host}). If its log shows the "
                 "server started, a firewall blocks the port: every task's port must be open "
                 "to the other hosts and to this kernel")
    places, found = explain_stuck(
        [run], [run], [(run.task, f"running, but port {run.port} never opened")])
    explained = [line for f in found for line in f.lines()] or places
    return WorkerTimeout(
        f"{run.task} did not become ready within {timeout:g} s: port {run.port} never "
        f"accepted connections{where}. {_first_upper(stacks_said([run]))} before it "
        "was ended.\n" + "".join(line + "\n" for line in explained) + tail_before_stacks(run),
        not_ready=[run.task], diagnosis=[f.to_dict() for f in found])


def _first_upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def stacks_said(runs: Sequence[TaskRun]) -> str:
    """Whether ``runs``, asked for their stacks (:func:`mwhelpers.job.dump_stacks`), wrote
    them: a few words for a message, lower case."""
    missing = [str(r.task) for r in runs if not r.stacks_written]
    one = len(runs) == 1
    if not missing:
        return "its Python stacks were written to its log" if one else \
            "Python stacks were written to the log"
    if len(missing) == len(runs):
        return ("it wrote no Python stacks to its log" if one else
                "they wrote no Python stacks to their logs") + " (asked twice)"
    return (f"Python stacks were written to the log, except by {', '.join(missing)} "
            "(asked twice)")


def timeout_error(stuck: Sequence[TaskRun], timeout: float, what: str, runs: Iterable[TaskRun],
                  not_ready: Sequence[tuple[Task, str]]) -> WorkerTimeout:
    """The WorkerTimeout of the ``stuck`` runs, which ``what`` within ``timeout`` s;
    ``runs``: every run of the cluster; ``not_ready``: (task, why) of the tasks that
    never became ready."""
    names = ", ".join(str(r.task) for r in stuck)
    msg = f"{names} {what} within {timeout:g} s and {'was' if len(stuck) == 1 else 'were'} ended; "
    msg += f"{stacks_said(stuck)} before ending."
    if not_ready:
        msg += "\nTasks of the cluster that never became ready: " + "; ".join(
            f"{t} ({why})" for t, why in not_ready)
        msg += ". A worker waits for all its peers: launch every task of the cluster."
    where, found = explain_stuck(stuck, list(runs), not_ready)
    msg += "".join("\n" + line for f in found for line in f.lines())
    if where:
        msg += "\nWhere each task was when it was ended (its stacks are in its log):\n" \
            + "\n".join(where)
    for r in stuck:
        msg += "\n" + tail_before_stacks(r)
    return WorkerTimeout(msg, not_ready=[t for t, _ in not_ready],
                         diagnosis=[f.to_dict() for f in found])
