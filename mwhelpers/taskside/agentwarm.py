"""The agent's warm starts (see ``_agent.py``, whose module text says what they are): a host's
warm server (:func:`serve`), a spare's own (:class:`OwnServer`), and a task forked by either
(:func:`fork_warm`, :class:`Forked`).  Sent to hosts as ``python -c`` source after ``wire.py``
and before ``_agent.py`` (``mwhelpers.backends.agent.AGENT_CODE``); standard library only.
"""

from __future__ import annotations  # never evaluated: the host's Python may be older than 3.10

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

try:
    from . import wire
except ImportError:  # run as ``python -c`` (AGENT_CODE): the kernel defined ``wire`` first
    wire = globals()["wire"]

FORK_TIMEOUT = 60.0  # seconds a forked task may take to say its pid (milliseconds, usually)
READY_TIMEOUT = 180.0  # seconds a warm server may take to import TensorFlow
MAX_MESSAGE = 1 << 22


def report(kind: wire.Report, *words: object) -> None:
    sys.stderr.write(wire.report(kind, *words) + "\n")
    sys.stderr.flush()


def die_with_parent() -> None:
    # The task's leader gets SIGKILL should the agent itself die.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Forked:
    """A task forked by its host's warm server: its pid, and its exit code as that server sends
    it on ``status`` (the task is the server's child, not this agent's)."""

    def __init__(self, pid: int, status: socket.socket) -> None:
        self.pid = pid
        self.status = status
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            try:
                data = self.status.recv(1 << 16)
            except OSError:
                data = b""
            self.status.close()
            try:
                kind, reply = wire.read_fork_message(data)
                code = int(reply["exit"]) if kind is wire.Fork.EXIT else 255
            except (ValueError, KeyError, TypeError):  # the server ended first: unknown
                code = 255
                while _running(self.pid):
                    time.sleep(0.1)
            self.returncode = code
        return self.returncode


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaps does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _same_user(sock: socket.socket) -> bool:
    """Whether the other end of ``sock`` runs as this process's user (an abstract socket has
    no file permissions, and its name is listed in /proc/net/unix)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return bool(struct.unpack("3i", creds)[1] == os.getuid())


def fork_warm(server: str | socket.socket, args: list[str], env: dict[str, str], cwd: str,
              passed: dict[str, int]) -> Forked | str:
    """Have a warm server fork the bootstrap with ``args`` (its log: this agent's standard
    output; ``passed``: descriptors by the variable that will name each): the host's, on the
    abstract socket of that name, or this spare's own (its control socket); the task, or why
    not."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        request = wire.fork_message(wire.Fork.TASK, argv=args, env=env, cwd=cwd,
                                    **{"pass": list(passed)})
        fds = [theirs.fileno(), 1, *passed.values()]
        if isinstance(server, socket.socket):
            socket.send_fds(server, [request], fds)
        else:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.settimeout(FORK_TIMEOUT)
                conn.connect("\0" + server)
                if not _same_user(conn):  # (its name was taken by another user's process)
                    raise OSError(f"the socket {server} belongs to another user")
                socket.send_fds(conn, [request], fds)
        theirs.close()
        mine.settimeout(FORK_TIMEOUT)
        data = mine.recv(1 << 16)
        if not data:
            why = "the warm server ended"
        else:
            kind, reply = wire.read_fork_message(data)
            if kind is wire.Fork.PID:
                mine.settimeout(None)
                return Forked(int(reply["pid"]), mine)
            why = reply.get("error") or f"it answered {kind.value} where a pid was expected"
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = f"{type(e).__name__}: {e}"
    theirs.close()
    mine.close()
    return why


def write_files(folder: str, files: dict[str, str]) -> None:
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


def await_ready(ctl: socket.socket) -> dict[str, Any] | str:
    """The warm-start server's ``ready`` fields, or why there are none."""
    ready = ctl.recv(1 << 16) if select.select([ctl], [], [], READY_TIMEOUT)[0] else None
    if ready is None:
        return f"it did not import within {READY_TIMEOUT:g} s"
    if not ready:
        return "it ended before it was ready"
    kind, reply = wire.read_fork_message(ready)
    if kind is not wire.Fork.READY:
        return str(reply.get("error") or f"it answered {kind.value}")
    return reply


def start_server(python: str, folder: str, how: dict[str, Any]
                 ) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A warm-start server (``_bootstrap.py --zygote`` in ``folder``) importing ``how``'s
    ``first`` with its ``env``, in its ``cwd``, and its control socket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWHELPERS_")}
    env.update(how.get("env", {}))
    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # The blank argument leaves room to show each task's own command line.
        zygote = subprocess.Popen(
            [python, "-u", os.path.join(folder, "_bootstrap.py"), "--zygote",
             str(theirs.fileno()), how.get("first") or "tensorflow", " " * 4096],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, cwd=how.get("cwd") or None, start_new_session=True,
            preexec_fn=die_with_parent, pass_fds=(theirs.fileno(),))
    except BaseException:
        ctl.close()
        raise
    finally:
        theirs.close()
    return zygote, ctl


class OwnServer:
    """A spare's own warm-start server (a ``serve`` in its preload), importing while the spare
    waits for its header, so that its task, forked there, stays in the spare's own unit (a
    Slurm job step), not a host server's.  It reports ``warm`` or ``cold``, as a host's server
    does, unless the header came first (its task is not forked: nothing to say)."""

    def __init__(self, folder: str, how: dict[str, Any]) -> None:
        # Started from the main thread: its PDEATHSIG fires when the thread that forked it ends.
        self.zygote, self.ctl = start_server(sys.executable, folder, how)
        self.why = "it was not ready"
        self.lock = threading.Lock()
        self.dropped = False
        self.thread = threading.Thread(target=self._await, daemon=True)
        self.thread.start()

    def _await(self) -> None:
        ready = await_ready(self.ctl)
        with self.lock:
            if self.dropped:
                return
            if isinstance(ready, str):
                self.why = ready
                report(wire.Report.COLD, ready)
                self.zygote.kill()
            else:
                self.why = ""
                report(wire.Report.WARM, json.dumps(ready))

    def take(self) -> socket.socket | None:
        """Its control socket, once ready (None: it failed; ``why`` says why)."""
        self.thread.join(READY_TIMEOUT)
        with self.lock:
            return None if self.why or self.dropped else self.ctl

    def drop(self) -> None:
        """No more tasks: its input ends (it leaves once its task has ended); one that never
        said ready is killed."""
        with self.lock:
            self.dropped = True
            self.ctl.close()
            if self.why:
                self.zygote.kill()


def serve(h: dict[str, Any]) -> int:
    """Be the host's warm server (``serve`` in the header: see the module's text)."""
    folder = tempfile.mkdtemp(prefix="mwhelpers-warm-")
    zygote: subprocess.Popen[bytes] | None = None
    ctl = listener = None
    served = False
    try:
        write_files(folder, h.get("files", {}))
        python = sys.executable if h["argv"][0] == wire.THIS_PYTHON else h["argv"][0]
        zygote, ctl = start_server(python, folder, h)
        ready = await_ready(ctl)
        if isinstance(ready, str):
            report(wire.Report.COLD, ready)
            return 1
        served = True
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind("\0" + h["serve"])
        listener.listen(64)
        report(wire.Report.WARM, json.dumps(ready))
        relay(listener, ctl, h.get("heartbeat"))
        return 0
    except (OSError, ValueError, KeyError, TypeError) as e:
        report(wire.Report.COLD, f"{type(e).__name__}: {e}")
        return 1
    finally:
        # No more tasks: the server leaves once its tasks have ended (one that never said
        # ready, at once).  A signal meanwhile (KeyboardInterrupt) leaves it to its PDEATHSIG.
        for sock in (listener, ctl):
            if sock is not None:
                sock.close()
        if zygote is not None:
            if not served:
                zygote.kill()
            zygote.wait()
        shutil.rmtree(folder, ignore_errors=True)


def relay(listener: socket.socket, ctl: socket.socket, heartbeat: float | None) -> None:
    """Pass each request that arrives on ``listener`` on to the server at ``ctl`` until this
    agent's input ends, the kernel has been silent for ``heartbeat`` seconds, or the server
    ends."""
    heard = time.monotonic()
    while True:
        wait = heartbeat / 4 if heartbeat else None
        readable = select.select([listener.fileno(), ctl.fileno(), 0], [], [], wait)[0]
        if 0 in readable:
            if not os.read(0, 65536):
                return
            heard = time.monotonic()
        if heartbeat and time.monotonic() - heard > heartbeat:
            return
        if ctl.fileno() in readable:  # the server said something unasked, or ended
            return
        if listener.fileno() in readable:
            conn, _ = listener.accept()
            with conn:
                if not _same_user(conn):  # only this agent's own user has tasks forked
                    continue
                conn.settimeout(5)
                try:
                    data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 8)
                except OSError:
                    continue
                try:
                    if data and fds:
                        socket.send_fds(ctl, [data], fds)
                finally:
                    for fd in fds:
                        os.close(fd)
