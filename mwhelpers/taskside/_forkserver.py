"""The warm-start server: an interpreter that imported TensorFlow once and forks the tasks of
the kernel's local launchers from there (``python -u _bootstrap.py --zygote``).
:mod:`mwhelpers.warmstart` is the kernel's side and says when it is used.

A task forked from here starts as a cold one would have gone on after its own
``import tensorflow``: in a session of its own, with its own environment (plus what
TensorFlow's import put there), folder, arguments and log.  The lines the import wrote are
copied to the top of its log, followed by one line that says it was forked.  Python's and
NumPy's global random generators are seeded anew.  ``ps`` shows it as
``python -u _bootstrap.py SCRIPT ARGS``.  Its ``/proc/PID/environ`` is the block it was
forked with, this server's (the variables it was started with): the kernel finds and ends it
by its run, not by its environment, and what it starts inherits its own.

The bootstrap loads this file by path: it imports nothing of the package.

The messages are declared in ``wire.py`` (:class:`wire.Fork`), one per packet of a
``SOCK_SEQPACKET`` socket:

* on the control socket, from here, once: ``ready`` after the import (whether that TensorFlow
  was built for GPUs; what the import set in and removed from the environment; whether it
  loaded JAX), or ``failed`` (then this process ends);
* on the control socket, to here, one per task: ``task`` (its arguments, environment, folder
  and the names of the passed descriptors) with the descriptors ``status, log, *passed``
  attached: ``status`` is this task's own socket, ``log`` takes its output, and each passed
  descriptor is inherited, its number in the environment variable its name gives;
* on the task's ``status`` socket: ``refused`` from here when it could not fork, or ``pid``
  from the task itself once it has its own session, title and environment, and ``exit`` from
  here once it has ended (as ``subprocess`` gives it: negative for a signal), possibly before
  it said its pid.

End of file on the control socket (the kernel closed it, or died) stops the forking; this
process leaves once its last task has ended.
"""

import ctypes
import importlib
import os
import selectors
import signal
import socket
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from . import wire

MAX_MESSAGE = 1 << 22
MAX_FDS = 8
NOTICE = ("[mwhelpers] warm start: this task was forked from a process that had imported "
          "TensorFlow already (a fresh interpreter instead: MWHELPERS_WARM_START=0)\n")


Request = dict[str, Any]  # a task message's fields: argv, env, cwd, pass


def send(sock: socket.socket, kind: wire.Fork, **fields: object) -> bool:
    try:
        sock.send(wire.fork_message(kind, **fields))
        return True
    except OSError:  # the kernel no longer listens on it
        return False


def set_title(words: list[str]) -> None:
    """What ``ps`` and ``/proc/PID/cmdline`` show for this process: ``words``, space-separated,
    written over the original arguments (the way setproctitle does); cut to fit."""
    try:
        fields = _stat_fields()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    if room < 2:
        return
    title = " ".join(words).encode(errors="replace")[: room - 2]
    # A title, its end, zeros, and a last byte that is not zero: Linux then reads the
    # arguments as one string up to the first zero.
    ctypes.memmove(start, title + b"\0" * (room - len(title) - 1) + b" ", room)


def _stat_fields() -> list[bytes]:
    """This process's /proc stat fields from the third on (index 0: field 3)."""
    with open("/proc/self/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _leave() -> NoReturn:
    """The server's own end, once no task is left: its output written out, then at once.  It
    ran no program of the user's, so nothing of theirs waits for Python's teardown, and that
    teardown, with TensorFlow loaded, took 5 to 6 s on a loaded 2-core machine (0.2 s this
    way): a notebook's end waited for it, and a suite took the server for a leaked process."""
    _flush_all()
    os._exit(0)


def _flush_all() -> None:
    """Python's and C's buffered output, written out before a fork copies it."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class Server:
    """Forks tasks on request, then tells each task's kernel-side waiter how it ended."""

    def __init__(self, ctl_fd: int, preamble: bytes, env_set: dict[str, str],
                 env_unset: list[str], bootstrap: str) -> None:
        self.ctl = socket.socket(fileno=ctl_fd)
        self.preamble = preamble
        self.env_set = env_set
        self.env_unset = env_unset
        self.bootstrap = bootstrap
        self.children: dict[int, socket.socket] = {}  # pid -> its status socket

    def serve(self) -> Request | None:
        """Fork tasks until the control socket ends and the last task has ended; returns only
        in a forked task: its request."""
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        sel = selectors.DefaultSelector()
        sel.register(self.ctl, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        accepting = True
        while accepting or self.children:
            for key, _ in sel.select():
                if key.fileobj is not self.ctl:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                try:
                    data, fds, _, _ = socket.recv_fds(self.ctl, MAX_MESSAGE, MAX_FDS)
                except OSError:
                    data, fds = b"", []
                if not data:  # no more tasks: stay until the last one has ended
                    accepting = False
                    sel.unregister(self.ctl)
                    self.ctl.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                request = self._fork(data, fds)
                if request is not None:  # the forked task
                    sel.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    return request
            self._reap()
        return None

    def _fork(self, data: bytes, fds: list[int]) -> Request | None:
        if not fds:  # nowhere to answer: not a request of the kernel's
            return None
        status = socket.socket(fileno=fds[0])
        try:
            kind, request = wire.read_fork_message(data)
            if kind is not wire.Fork.TASK:
                raise ValueError(f"a {kind.value} message where a task was expected")
            passed = list(request.get("pass", []))
            if len(fds) != 2 + len(passed):
                raise ValueError(f"{len(fds)} descriptors for {len(passed)} passed ones")
            _flush_all()
            with warnings.catch_warnings():  # Python 3.12 warns of fork in threads: none run
                warnings.simplefilter("ignore", DeprecationWarning)  # Python code here
                pid = os.fork()
        except Exception as e:
            send(status, wire.Fork.REFUSED, error=f"{type(e).__name__}: {e}")
            status.close()
            for fd in fds[1:]:
                os.close(fd)
            return None
        if pid == 0:
            self._become(request, status, fds[1], dict(zip(passed, fds[2:], strict=True)))
            return request
        for fd in fds[1:]:
            os.close(fd)
        # The task itself says its pid once it is in its own session, with its title and
        # environment: nobody looks for it before.  Its end comes from here.
        self.children[pid] = status
        return None

    def _reap(self) -> None:
        while self.children:
            try:
                pid, how = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status = self.children.pop(pid, None)
            if status is not None:
                send(status, wire.Fork.EXIT, exit=os.waitstatus_to_exitcode(how), pid=pid)
                status.close()

    def _become(self, request: Request, status: socket.socket, log: int,
                passed: dict[str, int]) -> None:
        """Turn this freshly forked process into the task ``request`` describes."""
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.ctl.close()  # the kernel sees the end of the server, not of this task
        for other in self.children.values():
            other.close()
        self.children = {}
        for fd in (1, 2):
            os.dup2(log, fd)
        os.close(log)
        env = dict(request["env"])
        env.update({name: str(fd) for name, fd in passed.items()})
        for name in self.env_unset:
            env.pop(name, None)
        env.update(self.env_set)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        _write_all(2, self.preamble + NOTICE.encode())
        set_title([sys.executable, "-u", self.bootstrap, *request["argv"]])
        send(status, wire.Fork.PID, pid=os.getpid())  # now it can be found, signalled and waited for
        status.close()
        importlib.invalidate_caches()  # files written since the server started import
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # (Python's random reseeds itself in a forked child)
            numpy.random.seed()
        sys.argv = [self.bootstrap, *request["argv"]]


def _gpu_build() -> bool:
    """Whether the imported TensorFlow was built for GPUs (CUDA or ROCm); True when unknown."""
    try:
        info = sys.modules["tensorflow"].sysconfig.get_build_info()
        return bool(info.get("is_cuda_build") or info.get("is_rocm_build"))
    except Exception:  # no such API in this TensorFlow
        return True


def run(ctl_fd: int, bootstrap: str, import_first: Callable[[], object]) -> None:
    """The server's life: set its title, import (``import_first()``, its output captured to be
    copied into every task's log), say ready, and serve; returns only in a forked task."""
    set_title([sys.executable, "-u", bootstrap, "--zygote"])
    ctl = socket.socket(fileno=os.dup(ctl_fd))
    captured = os.memfd_create("mwhelpers-import-output")
    quiet = os.open(os.devnull, os.O_WRONLY)
    before = dict(os.environ)
    for fd in (1, 2):
        os.dup2(captured, fd)
    # A task's own folder comes first on its sys.path (the bootstrap sets it); while the
    # server imports, mwhelpers' folder (this script's) is not on it.
    first = os.path.realpath(sys.path[0]) if sys.path and sys.path[0] else ""
    here = sys.path.pop(0) if first == os.path.realpath(os.path.dirname(bootstrap)) else None
    try:
        import_first()
    except BaseException as e:
        send(ctl, wire.Fork.FAILED, error=f"{type(e).__name__}: {e}")
        sys.exit(1)
    finally:
        if here is not None:
            sys.path.insert(0, here)
        _flush_all()
        for fd in (1, 2):
            os.dup2(quiet, fd)
        os.close(quiet)
    os.lseek(captured, 0, os.SEEK_SET)
    chunks: list[bytes] = []
    while True:
        chunk = os.read(captured, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(captured)
    env_set = {k: v for k, v in os.environ.items() if before.get(k) != v}
    env_unset = [k for k in before if k not in os.environ]
    # What the import did to the environment, and whether JAX itself was loaded (its flags
    # read their JAX_* variables then): the kernel side lets tasks that differ from this
    # server's environment only there fork from it (mwhelpers.warmstart.same_import).
    if not send(ctl, wire.Fork.READY, gpu_build=_gpu_build(), env_set=env_set,
                env_unset=env_unset, jax="jax._src.config" in sys.modules):
        _leave()
    ctl.close()
    server = Server(ctl_fd, b"".join(chunks), env_set, env_unset, bootstrap)
    if server.serve() is None:
        _leave()
