"""The ``local`` backend: tasks on this machine, each a child process in a session of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

import psutil

from .. import proctree, warmstart
from ..cluster import Task
from ..gpus import visible_gpus
from ..ports import reserve_ports
from ..proctree import Escalation
from .base import BOOTSTRAP, Launcher, LaunchSpec, Option, Placement, Process, end_local, open_log, text


class LocalProcess(Process):
    """A process on this machine, leader of its own session and process group: started by
    ``wait``'s owner (a Popen, or a warm-start server, which reports its exit code)."""

    def __init__(self, pid: int, wait: Callable[[], int], release_fd: int | None = None,
                 warm: bool = False) -> None:
        super().__init__(pid)
        self.warm = warm  # forked from a warm-start server (mwhelpers.warmstart)
        self._release_fd = release_fd  # a standby's: the write end of the pipe it waits on
        self._release_lock = threading.Lock()  # released, or closed at its exit: once
        self._start_waiter(wait)
        if release_fd is not None:
            self.on_exit(lambda _: self._close_release())

    def _release(self) -> None:
        with self._release_lock:
            fd, self._release_fd = self._release_fd, None
            if fd is None:
                raise OSError(f"pid {self.pid} is not waiting as a standby (it ended)")
            try:
                os.write(fd, b"1")  # OSError when it has just died: the caller starts anew
            finally:
                os.close(fd)

    def _close_release(self) -> None:
        with self._release_lock:
            fd, self._release_fd = self._release_fd, None
            if fd is not None:
                os.close(fd)

    def processes(self) -> list[psutil.Process]:
        if not self.running:
            # Descendants that outlived it stay in its process group.
            return [p for p in proctree.group_members(self.pid) if p.pid != os.getpid()]
        procs = proctree.tree(self.pid)
        seen = {p.pid for p in procs}
        procs += [p for p in proctree.group_members(self.pid) if p.pid not in seen]
        return [p for p in procs if p.pid != os.getpid()]

    def end(self, escalation: Escalation = proctree.DEFAULT_ESCALATION, who: str = "") -> list[str]:
        lines, ended = end_local(self.processes(), escalation, who)
        self.wait(2)
        self.ended_by = ended.get(self.pid, self.ended_by)
        return lines



class LocalLauncher(Launcher):
    """Tasks on this machine, each a child process in a session of its own.

    It holds the parent-death guard: a pipe whose write end only this
    process holds.  Every child gets the read end (``MWHELPERS_GUARD_FD``)
    and kills its own process group when the pipe reaches end of file,
    which happens when this process dies, however it dies, or when the
    launcher is closed.

    A task whose program imports TensorFlow is forked from a process that has imported
    it already (:mod:`mwhelpers.warmstart`; ``MWHELPERS_WARM_START=0`` turns it off).
    """

    name = "local"
    standby = True
    options = (Option("host", text, "localhost", "the address TF_CONFIG names for every task "
                      "(default localhost)", "ADDRESS"),)

    def __init__(self, host: str = "localhost") -> None:
        self.host = host
        self._guard_r: int | None
        self._guard_w: int | None
        self._guard_r, self._guard_w = os.pipe()
        self.started: list[Process] = []  # the Processes it started that may still run
        self.warm = warmstart.acquire(sys.executable, BOOTSTRAP)  # shared, see there

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
        env = dict(spec.env, MWHELPERS_GUARD_FD=str(guard))
        release_r = release_w = None
        if spec.standby:  # it waits for a byte on this pipe (LocalProcess.release)
            release_r, release_w = os.pipe()
            os.set_inheritable(release_w, False)
            env["MWHELPERS_STANDBY_FD"] = str(release_r)
        args = [*(["--standby"] if spec.standby else []), *(["--cell"] if spec.cell else []),
                spec.script, *spec.args]
        passed = {"MWHELPERS_GUARD_FD": guard}
        if release_r is not None:
            passed["MWHELPERS_STANDBY_FD"] = release_r
        logf = open_log(spec.log_path)
        try:
            forked = self.warm.start(spec.script, args, env, spec.cwd, logf, passed)
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
            for fd in (release_r, release_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            os.close(logf)
        if release_r is not None:
            os.close(release_r)
        proc = LocalProcess(pid, wait, release_w, warm=forked is not None)
        self.started = [p for p in self.started if p.running] + [proc]
        return proc

    def close(self) -> None:
        """SIGKILL whatever still runs, let go of the warm-start servers (the last launcher
        to close ends them), then close the guard pipe."""
        super().close()
        if self._guard_w is not None:  # (the first close)
            warmstart.release(self.warm)
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
