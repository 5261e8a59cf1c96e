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

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from . import proctree
from .gpus import visible_gpus
from .ports import reserve_ports

BOOTSTRAP = str(Path(__file__).with_name("_bootstrap.py"))


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
    """

    script: str
    args: list
    env: dict
    log_path: Path
    cell: bool = False
    cwd: str = None
    host: str = None
    port: int = None


class Placement(NamedTuple):
    """Where a task runs: ``host`` as its launcher reaches it (None: this machine),
    ``address`` as TF_CONFIG names it for the others, and its ``port``; ``hold``: what
    keeps the port for it until the cluster is closed (anything with ``release()``)."""

    host: str | None
    address: str
    port: int
    hold: object = None


class Process:
    """A started task: its exit status, exit time, and the way to signal and end it.

    Subclasses give :meth:`processes` (or override :meth:`send`) and :meth:`end`."""

    lost = None  # why its launcher gave it up for lost (no word from its host), if it did
    ended_by = None  # the signal that ended it when it was ended on request (its name)

    def __init__(self, pid, started=None):
        self.pid = pid
        self.started = time.monotonic() if started is None else started
        self.returncode = None
        self.ended = None  # time.monotonic() at exit, stamped by the wait thread
        self.ended_wall = None  # time.time() at exit, for records
        self._exited = threading.Event()
        self._listeners = []
        self._lock = threading.Lock()

    # -- the wait thread ---------------------------------------------------------
    def _start_waiter(self, wait_fn):
        def waiter():
            code = wait_fn()
            self._set_exit(code)

        threading.Thread(target=waiter, name=f"mwhelpers-wait-{self.pid}", daemon=True).start()

    def _set_exit(self, code):
        with self._lock:
            self.ended = time.monotonic()
            self.ended_wall = time.time()
            self.returncode = code
            listeners = list(self._listeners)
        self._exited.set()
        for fn in listeners:
            fn(self)

    def on_exit(self, fn):
        """Call ``fn(process)`` once it has exited (at once if it already has)."""
        with self._lock:
            if not self._exited.is_set():
                self._listeners.append(fn)
                return
        fn(self)

    # -- state -------------------------------------------------------------------
    @property
    def running(self):
        return not self._exited.is_set()

    def wait(self, timeout=None):
        """Wait until it has exited; its return code, or None on timeout."""
        self._exited.wait(timeout)
        return self.returncode

    # -- its processes -------------------------------------------------------------
    def processes(self):
        """The live processes that belong to it (psutil), for signalling."""
        raise NotImplementedError

    def send(self, sig):
        """Send ``sig`` to every process of its tree; returns what was signalled."""
        procs = self.processes()
        proctree.send(procs, sig)
        return procs

    def dump_stacks(self):
        """Have the task's Python write every thread's stack to its log (SIGUSR1)."""
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except OSError:
            pass

    def end(self, escalation=proctree.DEFAULT_ESCALATION, who=""):
        """End it (its whole tree) through ``escalation``, a sequence of (signal, seconds
        to wait); return once it is gone, with lines saying what ended with which signal
        (``who`` names the task in them) and what could not be ended."""
        raise NotImplementedError

    @property
    def label(self):
        """How the status table names it: its pid (``pid@host`` elsewhere)."""
        return str(self.pid)

    def describe(self):
        return f"pid {self.pid}"


class LocalProcess(Process):
    """A process on this machine, leader of its own session and process group."""

    def __init__(self, popen):
        super().__init__(popen.pid)
        self.popen = popen
        self._start_waiter(popen.wait)

    def processes(self):
        if not self.running:
            # Descendants that outlived it stay in its process group.
            return [p for p in proctree.group_members(self.pid) if p.pid != os.getpid()]
        procs = proctree.tree(self.pid)
        seen = {p.pid for p in procs}
        procs += [p for p in proctree.group_members(self.pid) if p.pid not in seen]
        return [p for p in procs if p.pid != os.getpid()]

    def end(self, escalation=proctree.DEFAULT_ESCALATION, who=""):
        lines, ended = end_local(self.processes(), escalation, who)
        self.wait(2)
        self.ended_by = ended.get(self.pid, self.ended_by)
        return lines


def end_local(procs, escalation, who=""):
    """End the psutil processes ``procs`` through ``escalation``: lines saying what ended
    with which signal (``who`` names their task) and what could not be ended, and
    ``{pid: signal name}``."""
    labels = {p.pid: proctree.describe(p) for p in procs}
    ended, survivors = proctree.end_processes(procs, escalation)
    prefix = f"{who}: " if who else ""
    return ([f"ended {prefix}{labels[pid]} with {how}" for pid, how in ended.items()]
            + [f"could NOT end {labels[p.pid]} (still alive after SIGKILL)" for p in survivors],
            ended)


def end_together(jobs):
    """Run the ending calls ``jobs`` (each returns its lines) at once, in threads: one
    slow host does not hold up the rest.  Every line, in the order of ``jobs``."""
    out = [None] * len(jobs)

    def one(i):
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


class Launcher:
    """A backend: places a cluster's tasks and starts them (one instance per cluster).

    A subclass gives ``name`` (how :mod:`mwhelpers.backends` finds it), ``options``
    (the keyword arguments it takes, each with what it means), :meth:`place` and
    :meth:`start`, and may give :meth:`task_env`, :meth:`host_gpus` and :meth:`close`.
    The base :meth:`close` ends the processes listed in ``self.started`` that still run:
    a backend that keeps that list (the built-in ones do) gets it for free.
    """

    name = None
    remote = False  # True: tasks run elsewhere (their ports are probed at their address)
    options = {}  # option -> what it means
    python = sys.executable  # the tasks' interpreter
    cwd = None  # the folder tasks start in (None: the kernel's, when each starts)

    def place(self, tasks, port_range):
        """``{task: Placement}`` for the cluster's ``tasks`` (ports in ``port_range``)."""
        raise NotImplementedError

    def task_env(self, environ):
        """What a task's environment starts from, given the kernel's (TF_CONFIG and
        mwhelpers' variables go on top)."""
        return dict(environ)

    def host_gpus(self):
        """``{host: [GPU ids]}`` of the hosts :meth:`place` chose."""
        return {}

    def start(self, spec):
        """Start ``spec`` and return its :class:`Process`."""
        raise NotImplementedError

    def close(self):
        """End what still runs (SIGKILL) and release what the launcher holds."""
        live = [p for p in getattr(self, "started", []) if p.running]
        end_together([partial(p.end, ((signal.SIGKILL, 3.0),)) for p in live])


class LocalLauncher(Launcher):
    """Tasks on this machine, each a child process in a session of its own.

    It holds the parent-death guard: a pipe whose write end only this
    process holds.  Every child gets the read end (``MWHELPERS_GUARD_FD``)
    and kills its own process group when the pipe reaches end of file,
    which happens when this process dies, however it dies, or when the
    launcher is closed.
    """

    name = "local"
    options = {"host": "the address TF_CONFIG names (default localhost)"}

    def __init__(self, host="localhost"):
        self.host = host
        self._guard_r, self._guard_w = os.pipe()
        self.started = []  # the Processes it started that may still run

    def place(self, tasks, port_range=None):
        """Ports free on this machine, reserved across processes until the cluster closes."""
        held = reserve_ports(len(tasks))
        return {t: Placement(None, self.host, r.port, r) for t, r in zip(tasks, held, strict=True)}

    def host_gpus(self):
        return {None: visible_gpus()}

    def start(self, spec):
        if self.closed:
            raise RuntimeError("this launcher was closed; create a new Runtime")
        spec.cwd = spec.cwd or os.getcwd()
        env = dict(spec.env, MWHELPERS_GUARD_FD=str(self._guard_r))
        argv = [sys.executable, "-u", BOOTSTRAP, *(["--cell"] if spec.cell else []),
                spec.script, *spec.args]
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "wb") as logf:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=env, cwd=spec.cwd, start_new_session=True,
                pass_fds=(self._guard_r,),
            )
        proc = LocalProcess(popen)
        self.started = [p for p in self.started if p.running] + [proc]
        return proc

    def close(self):
        """SIGKILL whatever still runs, then close the guard pipe."""
        super().close()
        for fd in (self._guard_r, self._guard_w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._guard_r = self._guard_w = None

    @property
    def closed(self):
        return self._guard_w is None
