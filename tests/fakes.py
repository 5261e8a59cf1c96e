"""Stand-in tasks that drive the real kernel side in-process, in milliseconds.

A backend registered as ``fake`` (``rt.define_cluster(2, backend="fake")``) starts no process:
each task is a thread that runs a *program*, a Python function of a :class:`FakeTask`, chosen by
the first line of the task's code (``rt.launch("worker:0", code="# fake: hangs")``).  Everything
around it is the package's own: the spawner's checks and environment, the runtime's follower
reading a real log file, the watcher, the job's readiness and deadlines, the supervisor, the
failure records (a fake that raises writes a real exit record, through ``taskside/wire.py``),
the diagnosis and the one way to end (``mwhelpers.ending``), which reaches a fake through its
:meth:`FakeProcess.end` as it reaches a real process through its backend.

A program says what a task does, in the terms the kernel sees: lines in its log
(:meth:`FakeTask.say`), its port accepting connections (:meth:`FakeTask.listen`), time passing
(:meth:`FakeTask.sleep`, which a signal interrupts), signals it ignores (``ignores``), an
exception (:meth:`FakeTask.fail`) or an exit code (its return value).  A signal it does not
ignore ends it as the kernel would see a killed process: exit code ``-signal``.  A stack dump
writes a dump in faulthandler's format into its log, unless its main thread is stuck where
Python's lock is held (``holds_lock``), where only the second way (by signal) reaches it.

What a fake cannot show (TensorFlow, real signals, process groups, other hosts) stays with the
tests that start real processes.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from mwhelpers import register_backend
from mwhelpers.backends.base import Launcher, LaunchSpec, Placement, Process, open_log
from mwhelpers.ports import reserve_ports
from mwhelpers.taskside.wire import Env, ExitRecord

PROGRAMS: dict[str, Callable[[FakeTask], int | None]] = {}
_PIDS = itertools.count(4_000_000)  # above any real pid (pid_max is at most 4,194,304)


def program(name: str) -> Callable[[Callable[[FakeTask], int | None]], Callable[[FakeTask], int | None]]:
    """Register a fake program under ``name`` (``# fake: NAME`` as a task's code)."""
    def register(fn: Callable[[FakeTask], int | None]) -> Callable[[FakeTask], int | None]:
        PROGRAMS[name] = fn
        return fn
    return register


def code(name: str) -> str:
    """The code that runs the fake program ``name``."""
    return f"# fake: {name}\n"


class Signalled(BaseException):
    """Raised inside a fake program by a signal it does not ignore."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


class FakeTask:
    """What a fake program sees and does (see the module's text)."""

    def __init__(self, spec: LaunchSpec, process: FakeProcess) -> None:
        self.spec = spec
        self.env = dict(spec.env)
        self.task = self.env.get(Env.TASK, "")
        self.attempt = int(self.env.get(Env.ATTEMPT, "1"))
        self.ignores: set[int] = set()  # signals this program ignores (never SIGKILL)
        self.holds_lock = False  # the first way of a stack dump does not reach it
        self._process = process
        self._server: socket.socket | None = None
        self.line_no = 1

    def say(self, *lines: str) -> None:
        with open(self.spec.log_path, "a") as f:
            f.write("".join(f"{line}\n" for line in lines))

    def listen(self) -> None:
        """Its port accepts connections from now on (a TensorFlow server started)."""
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.spec.port or 0))
        server.listen(8)
        self._server = server

    def sleep(self, seconds: float) -> None:
        """Time passes; a signal it does not ignore ends it here."""
        deadline = time.monotonic() + seconds
        while True:
            self._process.deliver()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._process.signalled.wait(min(left, 0.01))

    def fail(self, exc_type: type[BaseException], message: str) -> int:
        """The program raises: its traceback in the log and its exit record, exit code 1."""
        formatted = (f'Traceback (most recent call last):\n  File "/fake/{self.task}.py", '
                     f"line {self.line_no}, in <module>\n{exc_type.__name__}: {message}\n")
        self.say(*formatted.rstrip("\n").splitlines())
        path = self.env.get(Env.EXIT_RECORD)
        if path:
            record = ExitRecord(type=exc_type.__name__, message=message, traceback=formatted,
                                time=time.time(), pid=self._process.pid, exit_code=1)
            Path(path).write_text(record.dumps())
        return 1

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


class FakeProcess(Process):
    """A fake task's run, as the kernel's side sees a process (see the module's text)."""

    def __init__(self, spec: LaunchSpec, run: Callable[[FakeTask], int | None]) -> None:
        super().__init__(next(_PIDS))
        self.spec = spec
        self.signalled = threading.Event()
        self._pending: list[int] = []
        self._pending_lock = threading.Lock()
        self.task = FakeTask(spec, self)
        self.signals: list[int] = []  # every signal it was sent, in order
        self._start_waiter(lambda: self._main(run))

    def _main(self, run: Callable[[FakeTask], int | None]) -> int:
        try:
            code = run(self.task)
            return 0 if code is None else int(code)
        except Signalled as s:
            return -s.sig
        except Exception as e:  # a fake program's own mistake shows in its log, as a crash
            self.task.say(*traceback.format_exception(e))
            return 70
        finally:
            self.task.close()

    def deliver(self) -> None:
        """Called by the program's thread: act on the signals sent to it."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
            self.signalled.clear()
        for sig in pending:
            if sig == signal.SIGKILL or sig not in self.task.ignores:
                raise Signalled(sig)

    # -- what the kernel calls ---------------------------------------------------------------
    def processes(self) -> list:
        return []  # no process of its own: signals go through send()

    def send(self, sig: int) -> list:
        if self.running:
            with self._pending_lock:
                self._pending.append(int(sig))
                self.signals.append(int(sig))
                self.signalled.set()
        return []

    def dump_stacks(self) -> None:
        if self.running and not self.task.holds_lock:
            self._write_dump("dump")

    def dump_stacks_by_signal(self) -> None:
        if self.running:
            self._write_dump("signal")

    def _write_dump(self, how: str) -> None:
        me = f"{self.pid:x}"
        self.task.say(f"Current thread 0x{me}0 (most recent call first):",
                      f'  File "/fake/_bootstrap.py", line 1 in {how}',
                      f"Thread 0x{me}1 (most recent call first):",
                      f'  File "/fake/{self.task.task}.py", line {self.task.line_no} in <module>',
                      '  File "/fake/_bootstrap.py", line 2 in main')

    def end(self, escalation: Sequence[tuple[signal.Signals, float]] = (
            (signal.SIGKILL, 3.0),), who: str = "") -> list[str]:
        name = f"{who}: " if who else ""
        for sig, grace in escalation:
            if not self.running:
                break
            self.send(sig)
            if self.wait(grace) is not None:
                self.ended_by = sig.name
                return [f"ended {name}pid {self.pid} with {sig.name}"]
        if self.running:
            return [f"could NOT end {name}pid {self.pid}"]
        return []


class FakeLauncher(Launcher):
    """The ``fake`` backend: tasks are fake programs in threads of this process."""

    name = "fake"

    def __init__(self, options: object = None) -> None:
        self.started: list[Process] = []

    def place(self, tasks: Sequence, port_range: tuple[int, int] | None = None) -> dict:
        held = reserve_ports(len(tasks))
        return {t: Placement(None, "localhost", r.port, r) for t, r in zip(tasks, held, strict=True)}

    def start(self, spec: LaunchSpec) -> Process:
        first = Path(spec.script).read_text().splitlines()[:1]
        name = first[0].removeprefix("# fake:").strip() if first else ""
        if name not in PROGRAMS:
            raise ValueError(f"no fake program {name!r}; the code's first line names one "
                             f"(# fake: NAME) of {sorted(PROGRAMS)}")
        spec.cwd = spec.cwd or "."
        os.close(open_log(spec.log_path))
        process = FakeProcess(spec, PROGRAMS[name])
        self.started = [p for p in self.started if p.running] + [process]
        return process


register_backend("fake", FakeLauncher)


# -- programs that several tests use ---------------------------------------------------------
@program("ok")
def _ok(t: FakeTask) -> None:
    t.say(f"{t.task} ran")


@program("serves")
def _serves(t: FakeTask) -> None:
    """A TensorFlow server's life: listens, then trains a while and ends well."""
    t.listen()
    t.say("Epoch 1/1", "1/2 - loss: 0.5", "2/2 - loss: 0.4")
    t.sleep(0.2)


@program("never-ready")
def _never_ready(t: FakeTask) -> None:
    t.say("loading ...")
    t.sleep(600)


@program("hangs")
def _hangs(t: FakeTask) -> None:
    """Waits in a collective for a peer: Ctrl-C and SIGTERM do not stop it (as MWMS)."""
    t.ignores = {signal.SIGINT, signal.SIGTERM}
    t.listen()
    t.say("waiting for the peers")
    t.sleep(600)


@program("raises")
def _raises(t: FakeTask) -> int:
    t.listen()
    t.sleep(0.05)
    return t.fail(ValueError, "bad shapes")
