"""Process trees: find every descendant, signal them, escalate until they are gone."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection, Container, Iterable, Sequence
from enum import Enum

import psutil

from .errors import UsageError

_COMMON = "INT, TERM, KILL, HUP, QUIT, USR1, USR2, STOP, CONT (or their numbers)"


def parse_signal(value: int | str | signal.Signals) -> signal.Signals:
    """``'KILL'``, ``'sigkill'``, ``'9'``, ``9`` or a ``signal.Signals`` -> Signals."""
    if isinstance(value, signal.Signals):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        try:
            return signal.Signals(int(text))
        except ValueError:
            raise UsageError(f"{text} is not a signal number on this system; use {_COMMON}") from None
    name = text.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise UsageError(f"unknown signal {text!r}; use one of {_COMMON}") from None


# ``exit 128 + N`` is how shells and some launchers report death by signal N.
_SIGNAL_EXITS = {128 + s: s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGKILL,
                                      signal.SIGTERM)}


def signal_of(returncode: int | None) -> signal.Signals | None:
    """The signal a return code stands for, or None."""
    if returncode is None:
        return None
    if returncode < 0:
        try:
            return signal.Signals(-returncode)
        except ValueError:
            return None
    return _SIGNAL_EXITS.get(returncode)


def describe_exit(returncode: int | None) -> str:
    """'exit code 3', 'killed by SIGKILL', 'still running'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        sig = signal_of(returncode)
        return f"killed by {sig.name}" if sig else f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def alive(proc: psutil.Process) -> bool:
    """A psutil.Process that exists and is not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tree(pid: int, include_root: bool = True) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants, as psutil.Process objects."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return []
    procs = [root] if include_root else []
    try:
        procs += root.children(recursive=True)
    except psutil.Error:
        pass
    return procs


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes in process group ``pgid`` (catches re-parented orphans)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p)
        except (OSError, psutil.Error):
            pass
    return found


def group(leader: int, leader_running: bool = True) -> list[psutil.Process]:
    """The live processes of the process group that ``leader`` leads (a process started in a
    session of its own): ``leader`` and its descendants while it runs (``leader_running``:
    once it is reaped its pid may be another process's), and every other member of its group
    (descendants re-parented when their parent died); never this process."""
    procs = tree(leader) if leader_running else []
    seen = {p.pid for p in procs}
    procs += [p for p in group_members(leader) if p.pid not in seen]
    return [p for p in procs if p.pid != os.getpid()]


def signal_group(leader: int, sig: int, leader_running: bool = True) -> list[psutil.Process]:
    """Send ``sig`` to :func:`group` of ``leader``: to the process group first, in one call
    (``os.killpg``; every member gets it before anything is scanned), then to each other
    process of it (a descendant with a session of its own).  Returns what was signalled.

    A fault injected at a step must land there: scanning every process first took 53 ms on
    a loaded 2-core machine, as long as some 17 training steps.  Only while ``leader`` runs
    (unreaped, its pid is still its group's id) and leads its group; else the scan alone."""
    first = False
    if leader_running and leader != os.getpid():
        try:
            if os.getpgid(leader) == leader:
                os.killpg(leader, sig)
                first = True
        except OSError:
            pass
    procs = group(leader, leader_running)
    if not first:
        send(procs, sig)
        return procs
    others = []
    for p in procs:
        try:
            if os.getpgid(p.pid) != leader:
                others.append(p)
        except OSError:
            pass
    send(others, sig)
    return procs


def carrying(key: str, value: str, exclude: Container[int] = (),
             where: Callable[[dict[str, str]], bool] | None = None) -> list[psutil.Process]:
    """Live processes whose environment has ``key=value`` (and, with ``where``, for which
    ``where(environ)`` is true), minus the pids in ``exclude``.

    A mark set in a process's environment is inherited by everything it
    starts, so this finds descendants even after they were re-parented.
    """
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in exclude:
            continue
        try:
            env = p.environ()
            if env.get(key) == value and (where is None or where(env)) and alive(p):
                found.append(p)
        except psutil.Error:
            pass
    return found


def catches(pid: int, sig: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in ``/proc/PID/status``);
    None where that cannot be read (not Linux, gone).  A stack-dump request by SIGUSR1 ends a
    process without one: a task whose program replaced itself with another one (``exec``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def send(procs: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process that is still alive; ignore the vanished."""
    for p in procs:
        try:
            if alive(p):
                p.send_signal(sig)
        except psutil.Error:
            pass


def wait_gone(procs: Collection[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to end; return the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        survivors = [p for p in procs if alive(p)]
        if not survivors or time.monotonic() >= deadline:
            return survivors
        time.sleep(0.02)


# How a process tree is ended: each step a signal and the seconds given to it.
Escalation = Sequence[tuple[signal.Signals, float]]
# The escalations, by name.
ESCALATIONS: dict[str, Escalation] = {
    # politely, as a terminal's Ctrl-C would, then firmer (%killbgscripts, end_all)
    "gentle": ((signal.SIGINT, 1.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, 3.0)),
    # the user interrupted a cell: a chance to exit, then gone
    "interrupt": ((signal.SIGTERM, 1.0), (signal.SIGKILL, 3.0)),
    # at once: peers of a failed task (nothing to save: a synchronous job cannot go on), a
    # stuck task once its stacks are dumped, everything when the runtime closes
    "now": ((signal.SIGKILL, 3.0),),
}


class Policy(str, Enum):
    """How runs are ended: the name of an escalation of :data:`ESCALATIONS`.  A stuck task
    has its stacks dumped first (:func:`mwhelpers.job.dump_stacks`), then is ended ``NOW``."""

    NOW = "now"
    INTERRUPT = "interrupt"
    GENTLE = "gentle"

    @property
    def escalation(self) -> Escalation:
        return ESCALATIONS[self.value]

    @classmethod
    def parse(cls, value: Policy | str) -> Policy:
        """``value`` as a Policy; UsageError naming the policies when it is none."""
        try:
            return cls(value)
        except ValueError:
            raise UsageError(f"policy {value!r}: one of {', '.join(p.value for p in cls)}") from None


DEFAULT_ESCALATION = ESCALATIONS["gentle"]


def end_processes(
    procs: Iterable[psutil.Process], escalation: Escalation = DEFAULT_ESCALATION,
) -> tuple[dict[int, str], list[psutil.Process]]:
    """Signal ``procs`` with each step of ``escalation`` until none is left.

    Returns ``{pid: signal name that ended it}`` ('already gone' for the
    ones that ended before we asked) and the list of survivors (empty unless
    even SIGKILL failed, e.g. for a process in uninterruptible sleep).
    """
    procs = [p for p in procs if alive(p)]
    ended: dict[int, str] = {}
    for sig, grace in escalation:
        if not procs:
            break
        send(procs, sig)
        survivors = wait_gone(procs, grace)
        for p in procs:
            if p not in survivors:
                ended[p.pid] = sig.name
        procs = survivors
    return ended, procs


def describe(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        cmd = "?"
    return f"pid {proc.pid} ({cmd[:100]})"
