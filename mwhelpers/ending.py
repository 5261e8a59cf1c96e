"""Ending what the package started: one function, :func:`end`, with a policy.

Every process the kernel side starts ends through :func:`end`: a task's run
(:func:`mwhelpers.job.end_runs`, which notes why on each run, calls it), a standby no restart
needed, ipyparallel's controller, what a launcher still runs when its cluster closes, a
warm-start server's group, the transport of a lost host, the leftovers of a notebook suite.
It takes a :class:`~mwhelpers.proctree.Policy`, never a string: the user's strings become a
policy at the edge (``Runtime.end_all``, the magics) with :meth:`Policy.parse`.

Two kinds of target, ended all at once (one slow host does not hold up the rest):

* a backend's process (anything with ``running`` and ``end(escalation, who)``: a
  :class:`~mwhelpers.backends.base.Process`), which escalates its own way (here: signals to
  its process group; elsewhere: commands to its agent);
* local processes found by ``psutil`` (``local=``), escalated here by
  :func:`mwhelpers.proctree.end_processes`.

:func:`end_local` is the part a backend's ``Process.end`` on this machine uses.  Only this
module and those ``end`` methods call the escalation itself (``tests/inprocess/test_layout.py``).  What
to do before a stuck task ends (its stacks into its log) is :func:`mwhelpers.job.dump_then_end`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from functools import partial
from typing import Protocol

import psutil

from . import proctree
from .proctree import Escalation, Policy


class Endable(Protocol):
    """A process the package started, as a backend gives it (its ``end`` escalates)."""

    @property
    def running(self) -> bool: ...

    def end(self, escalation: Escalation = ..., who: str = "") -> list[str]: ...


def end(processes: Iterable[tuple[Endable, str]] = (), policy: Policy = Policy.NOW, *,
        local: Collection[psutil.Process] = ()) -> list[str]:
    """End ``processes`` (each with the name its lines give it; '' for its own) that still
    run, and the ``local`` psutil processes, through ``policy``'s escalation, all at once.
    Returns lines saying what ended with which signal, and what could not be ended."""
    if not isinstance(policy, Policy):
        raise TypeError(f"end() takes a Policy, not {policy!r}: parse the user's word at the "
                        "edge (Policy.parse)")
    escalation = policy.escalation
    jobs: list[Callable[[], Iterable[str] | None]] = [
        partial(p.end, escalation, who) for p, who in processes if p.running]
    if local:
        jobs.append(lambda: end_local(local, escalation)[0])
    return _together(jobs)


def end_local(procs: Collection[psutil.Process], escalation: Escalation,
              who: str = "") -> tuple[list[str], dict[int, str]]:
    """End the psutil processes ``procs`` through ``escalation``: lines saying what ended
    with which signal (``who`` names their task) and what could not be ended, and
    ``{pid: signal name}``.  For a backend's ``Process.end`` on this machine; everything else
    calls :func:`end`."""
    labels = {p.pid: proctree.describe(p) for p in procs}
    ended, survivors = proctree.end_processes(procs, escalation)
    prefix = f"{who}: " if who else ""
    return ([f"ended {prefix}{labels[pid]} with {how}" for pid, how in ended.items()]
            + [f"could NOT end {labels[p.pid]} (still alive after SIGKILL)" for p in survivors],
            ended)


def _together(jobs: Sequence[Callable[[], Iterable[str] | None]]) -> list[str]:
    """Run the ending calls ``jobs`` (each returns its lines) at once, in threads.  Every
    line, in the order of ``jobs``."""
    out: list[Iterable[str] | None] = [None] * len(jobs)

    def one(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as e:  # one that cannot be ended must not hide the others' report
            out[i] = [f"could NOT end everything: {type(e).__name__}: {e}"]

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [line for lines in out if lines for line in lines]
