"""Starting, signalling, ending and reaping task processes: the backend interface.

A :class:`Launcher` is a backend (see :mod:`mwhelpers.backends` for how one is
found by name): for one cluster it places the tasks (:meth:`Launcher.place`:
where each runs, the address the others reach it at, its port), says what
environment a task starts from (:meth:`Launcher.task_env`) and turns a
:class:`LaunchSpec` (the command, its environment, its log file) into a
running :class:`Process`.  Every :class:`Process` keeps one contract, here
and elsewhere: ``send`` a signal to its whole tree, ``dump_stacks``, ``end``
with an escalation of signals and say how it ended, list its local
``processes``.  The runtime knows nothing else about how or where a task runs.

Every :class:`Process` has a wait thread that reaps it the moment it exits
and stamps the exit time then (not when someone next looks): which task died
first is decided by these stamps.  Listeners registered with
:meth:`Process.on_exit` are called from that thread.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

import psutil

from .. import exitrecord, proctree
from ..cluster import Task
from ..ending import end
from ..ports import PortHold
from ..proctree import Escalation, Policy
from .options import BackendOptions

if TYPE_CHECKING:
    from ..warmstart import WarmStarter

BOOTSTRAP = str(Path(__file__).parents[1] / "taskside" / "_bootstrap.py")


@dataclass
class LaunchSpec:
    """What to start: the Python program ``script`` with ``args``, through the
    worker bootstrap, with ``env`` in ``cwd``, its output to ``log_path``.

    ``cell``: ``script`` holds a notebook cell's code (``sys.path[0]`` is
    then the working directory, as for ``python -c``).  ``env`` holds the
    whole environment of a task on this machine, or, for a task on another
    host, what it gets on top of its login environment.  ``cwd`` None: the
    launcher's folder (it fills it in when it starts the task).  ``host`` and
    ``port``: where it runs (None: here) and the port it will listen on.
    ``standby``: start the process ahead of its launch (only where the launcher's
    ``standby`` is true): it imports TensorFlow, then waits until :meth:`Process.release`.
    """

    script: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    cell: bool = False
    cwd: str | None = None
    host: str | None = None
    port: int | None = None
    standby: bool = False  # start it ahead: TensorFlow imported, then wait for Process.release


class Placement(NamedTuple):
    """Where a task runs: ``host`` as its launcher reaches it (None: this machine),
    ``address`` as TF_CONFIG names it for the others, and its ``port``; ``hold``: what
    keeps the port for it until the cluster is closed (anything with ``release()``)."""

    host: str | None
    address: str
    port: int
    hold: PortHold | None = None


class Process:
    """A started task: its exit status, exit time, and the way to signal and end it.

    Subclasses give :meth:`processes` (or override :meth:`send`) and :meth:`end`."""

    lost: str | None = None  # why its launcher gave it up for lost (no word from its host)
    ended_by: str | None = None  # the signal that ended it when it was ended on request (its name)

    def __init__(self, pid: int, started: float | None = None) -> None:
        self.pid = pid
        self.started = time.monotonic() if started is None else started
        self.returncode: int | None = None
        self.ended: float | None = None  # time.monotonic() at exit, stamped by the wait thread
        self.ended_wall: float | None = None  # time.time() at exit, for records
        self._exited = threading.Event()
        self._listeners: list[Callable[[Process], object]] = []
        self._lock = threading.Lock()

    # -- the wait thread ---------------------------------------------------------
    def _start_waiter(self, wait_fn: Callable[[], int]) -> None:
        def waiter() -> None:
            code = wait_fn()
            self._set_exit(code)

        threading.Thread(target=waiter, name=f"mwhelpers-wait-{self.pid}", daemon=True).start()

    def _set_exit(self, code: int) -> None:
        with self._lock:
            self.ended = time.monotonic()
            self.ended_wall = time.time()
            self.returncode = code
            listeners = list(self._listeners)
        self._exited.set()
        for fn in listeners:
            fn(self)

    def on_exit(self, fn: Callable[[Process], object]) -> None:
        """Call ``fn(process)`` once it has exited (at once if it already has)."""
        with self._lock:
            if not self._exited.is_set():
                self._listeners.append(fn)
                return
        fn(self)

    # -- state -------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return not self._exited.is_set()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait until it has exited; its return code, or None on timeout."""
        self._exited.wait(timeout)
        return self.returncode

    # -- its processes -------------------------------------------------------------
    def processes(self) -> list[psutil.Process]:
        """The live processes that belong to it (psutil), for signalling."""
        raise NotImplementedError

    def send(self, sig: int) -> list[psutil.Process]:
        """Send ``sig`` to every process of its tree; returns what was signalled."""
        procs = self.processes()
        proctree.send(procs, sig)
        return procs

    def dump_stacks(self) -> None:
        """Have the task's Python write every thread's stack to its log (SIGUSR1 here; a
        backend may have a safer way); not to a process that does not handle SIGUSR1 (it
        would end it: a program that replaced itself with another, by ``exec``)."""
        if self.running:  # (once reaped, its pid may be another process's)
            top = proctree.tree(self.pid)[:1]
            if top and proctree.catches(top[0].pid, signal.SIGUSR1) is not False:
                proctree.send(top, signal.SIGUSR1)

    def dump_stacks_by_signal(self) -> None:
        """The same through SIGUSR1's handler, for a task whose log :meth:`dump_stacks` did not
        reach (a thread of it holds Python's lock); where that is already a signal, again."""
        self.dump_stacks()

    def end(self, escalation: Escalation = proctree.DEFAULT_ESCALATION, who: str = "") -> list[str]:
        """End it (its whole tree) through ``escalation``, a sequence of (signal, seconds
        to wait); return once it is gone, with lines saying what ended with which signal
        (``who`` names the task in them) and what could not be ended."""
        raise NotImplementedError

    # -- standbys ----------------------------------------------------------------------
    standby_since: float | None = None  # time.monotonic() it was started ahead, once released

    def release(self) -> None:
        """Let a process started as a standby (``LaunchSpec.standby``) run its program; its
        start time becomes now (the launch), ``standby_since`` the time it was started."""
        self._release()
        self.standby_since, self.started = self.started, time.monotonic()

    def _release(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} was not started as a standby")

    @property
    def label(self) -> str:
        """How the status table names it: its pid (``pid@host`` elsewhere)."""
        return str(self.pid)

    def describe(self) -> str:
        return f"pid {self.pid}"


def open_log(path: Path) -> int:
    """A new, empty log file for a task, opened for appending: the task's output and the lines
    the kernel adds itself (a transport's own words, a lost host) then all go to the file's end
    instead of overwriting each other.  An earlier run's exit record beside it goes (see
    :mod:`mwhelpers.exitrecord`).  The caller closes the descriptor once the task's process
    has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    exitrecord.path_for(path).unlink(missing_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)


class Lent(Protocol):
    """What a runtime lends the launchers of its clusters (its
    :class:`mwhelpers.services.Services`), which it ends when it closes."""

    def warm_starter(self, python: str, bootstrap: str) -> WarmStarter:
        """The runtime's warm starter of tasks that ``python`` starts with ``bootstrap``."""
        ...


class Launcher:
    """A backend: places a cluster's tasks and starts them (one instance per cluster).

    A subclass gives ``name`` (how :mod:`mwhelpers.backends` finds it), ``options`` (its
    options' frozen dataclass, a :class:`~mwhelpers.backends.options.BackendOptions`; its
    constructor takes one instance of it, made from what the user gave, checked and
    converted), :meth:`place` and :meth:`start`, and may give :meth:`task_env`,
    :meth:`host_gpus`, :meth:`notes` and :meth:`close`.
    The base :meth:`close` ends the processes listed in ``self.started`` that still run:
    a backend that keeps that list (the built-in ones do) gets it for free.
    """

    name: ClassVar[str | None] = None
    remote: ClassVar[bool] = False  # True: tasks run elsewhere (ports probed at their address)
    options: ClassVar[type[BackendOptions]] = BackendOptions  # what its constructor takes
    python: str = sys.executable  # the tasks' interpreter
    standby: ClassVar[bool] = False  # True: it can start a LaunchSpec with standby=True
    cwd: str | None = None  # the folder tasks start in (None: the kernel's, when each starts)

    def __init__(self, options: BackendOptions | None = None) -> None:
        """A backend that takes no options needs no constructor of its own."""

    @classmethod
    def create(cls, options: BackendOptions, services: Lent) -> Launcher:
        """The launcher of one cluster of the runtime that owns ``services`` (what it
        lends, such as the warm-start servers: :class:`Lent`); by default made from its
        options alone."""
        return cls(options)

    def place(self, tasks: Sequence[Task], port_range: tuple[int, int]) -> dict[Task, Placement]:
        """``{task: Placement}`` for the cluster's ``tasks`` (ports in ``port_range``)."""
        raise NotImplementedError

    def task_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What a task's environment starts from, given the kernel's (TF_CONFIG and
        mwhelpers' variables go on top)."""
        return dict(environ)

    def notes(self) -> list[str]:
        """What the user should know about where :meth:`place` put the tasks (a cluster that
        runs code for anyone who reaches it, say), said once the cluster is defined."""
        return []

    def host_gpus(self) -> dict[str | None, list[str]]:
        """``{host: [GPU ids]}`` of the hosts :meth:`place` chose."""
        return {}

    def prepare(self, envs: Mapping[str | None, list[dict[str, str]]]) -> None:
        """Once the cluster is defined: the environments its tasks will start with, by host
        (a task's own launch may add to them); a launcher may start things ahead (the agent
        backends' warm servers: :mod:`mwhelpers.backends.warmhosts`).  Nothing by default."""

    def start(self, spec: LaunchSpec) -> Process:
        """Start ``spec`` and return its :class:`Process`."""
        raise NotImplementedError

    def close(self) -> None:
        """End what still runs (SIGKILL) and release what the launcher holds."""
        end([(p, "") for p in getattr(self, "started", [])], Policy.NOW)
