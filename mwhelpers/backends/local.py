"""The ``local`` backend: tasks on this machine, each a child process in a session of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from .. import proctree
from ..cluster import Task
from ..ending import end_local
from ..gpus import visible_gpus
from ..ports import reserve_ports
from ..proctree import Escalation
from ..taskside.wire import Env
from ..warmstart import WarmStarter
from .base import BOOTSTRAP, Launcher, LaunchSpec, Lent, Placement, Process, open_log
from .options import BackendOptions, option, text


class LocalProcess(Process):
    """A process on this machine, leader of its own session and process group: started by
    ``wait``'s owner (a Popen, or a warm-start server, which reports its exit code)."""

    def __init__(self, pid: int, wait: Callable[[], int], warm: bool = False,
                 dump_fd: int | None = None) -> None:
        super().__init__(pid)
        self.warm = warm  # forked from a warm-start server (mwhelpers.warmstart)
        self._dump_fd = dump_fd  # the write end of its MWHELPERS_DUMP_FD pipe, until it exits

        def wait_then_close() -> int:
            try:
                return wait()
            finally:
                self._close_dump()

        self._start_waiter(wait_then_close)

    def dump_stacks(self) -> None:
        """Ask the task's dump thread (a byte on its pipe), which writes the stacks holding
        Python's lock, so that no thread can end under it; SIGUSR1 where there is no pipe."""
        with self._lock:
            fd = self._dump_fd if self.running else None
            if fd is not None:
                try:
                    os.write(fd, b"d")
                    return
                except OSError:  # it has closed its end (it is on its way out)
                    pass
        super().dump_stacks()

    def dump_stacks_by_signal(self) -> None:
        super().dump_stacks()

    def _close_dump(self) -> None:
        with self._lock:
            fd, self._dump_fd = self._dump_fd, None
        if fd is not None:
            os.close(fd)

    def processes(self) -> list[psutil.Process]:
        # Descendants that outlived it stay in its process group.
        return proctree.group(self.pid, self.running)

    def send(self, sig: int) -> list[psutil.Process]:
        """``sig`` to its process group at once, then to what left the group."""
        return proctree.signal_group(self.pid, sig, self.running)

    def end(self, escalation: Escalation = proctree.DEFAULT_ESCALATION, who: str = "") -> list[str]:
        lines, ended = end_local(self.processes(), escalation, who)
        self.wait(2)
        self.ended_by = ended.get(self.pid, self.ended_by)
        return lines


@dataclass(frozen=True)
class LocalOptions(BackendOptions):
    """The local backend's options."""

    host: str = option(text, "the address TF_CONFIG names for every task (default localhost)",
                       default="localhost", metavar="ADDRESS")


class LocalLauncher(Launcher):
    """Tasks on this machine, each a child process in a session of its own.

    It holds the parent-death guard: a pipe whose write end only this
    process holds.  Every child gets the read end (``MWHELPERS_GUARD_FD``)
    and kills its own process group when the pipe reaches end of file,
    which happens when this process dies, however it dies, or when the
    launcher is closed.

    A task whose program imports TensorFlow is forked from a process that has imported
    it already (:mod:`mwhelpers.warmstart`; ``MWHELPERS_WARM_START=0`` turns it off), the
    warm starter ``warm`` its runtime lends it (:meth:`create`); without one, every task
    starts cold.  So it starts no standbys (``supervise(standby=True)``): a restart skips the
    import anyway.
    """

    name = "local"
    options = LocalOptions

    def __init__(self, options: LocalOptions = LocalOptions()) -> None:
        self.host = options.host
        self._guard_r: int | None
        self._guard_w: int | None
        self._guard_r, self._guard_w = os.pipe()
        self.started: list[Process] = []  # the Processes it started that may still run
        # Its runtime's warm starter, which ends its servers (mwhelpers.services): lent by
        # create(); None: every task starts cold.
        self.warm: WarmStarter | None = None

    @classmethod
    def create(cls, options: BackendOptions, services: Lent) -> LocalLauncher:
        launcher = cls(options)  # type: ignore[arg-type]  # (a subclass's own options too)
        launcher.warm = services.warm_starter(sys.executable, BOOTSTRAP)
        return launcher

    def place(self, tasks: Sequence[Task],
              port_range: tuple[int, int] | None = None) -> dict[Task, Placement]:
        """Ports free on this machine, reserved across processes until the cluster closes."""
        held = reserve_ports(len(tasks))
        return {t: Placement(None, self.host, r.port, r) for t, r in zip(tasks, held, strict=True)}

    def host_gpus(self) -> dict[str | None, list[str]]:
        return {None: visible_gpus()}

    def start(self, spec: LaunchSpec) -> Process:
        guard = self._guard_r
        if self.closed or guard is None:
            raise RuntimeError("this launcher was closed; create a new Runtime")
        spec.cwd = spec.cwd or os.getcwd()
        if spec.standby:
            raise ValueError("the local backend starts no standbys (warm starts skip "
                             "TensorFlow's import at a restart instead)")
        dump_r, dump_w = os.pipe()
        os.set_blocking(dump_w, False)  # a full pipe has requests enough
        passed = {Env.GUARD_FD: guard, Env.DUMP_FD: dump_r}
        env = {**spec.env, **{name: str(fd) for name, fd in passed.items()}}
        args = [*(["--cell"] if spec.cell else []), spec.script, *spec.args]
        try:
            logf = open_log(spec.log_path)
        except BaseException:
            os.close(dump_r)
            os.close(dump_w)
            raise
        try:
            forked = (self.warm.start(spec.script, args, env, spec.cwd, logf, passed)
                      if self.warm is not None else None)
            if forked is not None:
                pid, wait = forked
            else:
                popen = subprocess.Popen(
                    [sys.executable, "-u", BOOTSTRAP, *args], stdin=subprocess.DEVNULL,
                    stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=spec.cwd,
                    start_new_session=True, pass_fds=tuple(passed.values()),
                )
                pid, wait = popen.pid, popen.wait
        except BaseException:
            os.close(dump_w)
            raise
        finally:
            os.close(logf)
            os.close(dump_r)
        proc = LocalProcess(pid, wait, warm=forked is not None, dump_fd=dump_w)
        self.started = [p for p in self.started if p.running] + [proc]
        return proc

    def close(self) -> None:
        """SIGKILL whatever still runs, then close the guard pipe (the warm-start servers
        are its runtime's, which ends them)."""
        super().close()
        for fd in (self._guard_r, self._guard_w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._guard_r = self._guard_w = None

    @property
    def closed(self) -> bool:
        return self._guard_w is None
