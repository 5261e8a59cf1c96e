"""Starting, signalling and reaping task processes.

A :class:`Launcher` turns a :class:`LaunchSpec` (the command, its
environment, its log file) into a running :class:`Process`.  The runtime
knows nothing else about how a process is started, so a launcher that runs
the same command over SSH or under ``srun`` is a new subclass, not edits
across the runtime.

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
from dataclasses import dataclass, field
from pathlib import Path

from . import proctree

BOOTSTRAP = str(Path(__file__).with_name("_bootstrap.py"))


@dataclass
class LaunchSpec:
    """What to start: the Python program ``script`` with ``args``, through the
    worker bootstrap, with ``env`` in ``cwd``, its output to ``log_path``.

    ``cell``: ``script`` holds a notebook cell's code (``sys.path[0]`` is
    then the working directory, as for ``python -c``).  ``env`` holds the
    whole environment of a task on this machine, or, for a task on another
    host, what it gets on top of its login environment.  ``cwd`` None: the
    launcher's folder.  ``host`` and ``port``: where it runs (None: here) and
    the port it will listen on.
    """

    script: str
    args: list
    env: dict
    log_path: Path
    cell: bool = False
    cwd: str = field(default_factory=os.getcwd)
    host: str = None
    port: int = None


class Process:
    """A started process: its exit status, exit time and process tree."""

    remote = False  # True: its processes live on another machine (commands, not psutil)
    lost = None  # why its launcher gave it up for lost (no word from its host), if it did

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


class Launcher:
    """Starts processes; subclasses say where and how."""

    def start(self, spec):
        """Start ``spec`` and return its :class:`Process`."""
        raise NotImplementedError

    def close(self):
        """Release what the launcher holds (its processes are ended first)."""


class LocalLauncher(Launcher):
    """Runs each task as a child process of this one, in a session of its own.

    It holds the parent-death guard: a pipe whose write end only this
    process holds.  Every child gets the read end (``MWHELPERS_GUARD_FD``)
    and kills its own process group when the pipe reaches end of file,
    which happens when this process dies, however it dies, or when the
    launcher is closed.
    """

    def __init__(self):
        self._guard_r, self._guard_w = os.pipe()
        self.started = []  # the Processes it started that may still run

    def start(self, spec):
        if self.closed:
            raise RuntimeError("this launcher was closed; create a new Runtime")
        env = dict(spec.env, MWHELPERS_GUARD_FD=str(self._guard_r))
        argv = [sys.executable, "-u", BOOTSTRAP, *(["--cell"] if spec.cell else []),
                spec.script, *spec.args]
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "wb") as logf:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=env, cwd=spec.cwd, start_new_session=True, pass_fds=(self._guard_r,),
            )
        proc = LocalProcess(popen)
        self.started = [p for p in self.started if p.running] + [proc]
        return proc

    def close(self):
        """SIGKILL whatever still runs, then close the guard pipe."""
        live = [p for p in self.started if p.running]
        if live:
            procs = [q for p in live for q in p.processes()]
            proctree.end_processes(procs, escalation=((signal.SIGKILL, 2.0),))
            for p in live:
                p.wait(2.0)
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
