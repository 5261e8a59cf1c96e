"""The task agent: runs one task on another machine and ties its life to the kernel's.

The kernel starts it as ``PYTHON -c <this file's text>`` through a transport
that carries standard input and output, ``ssh HOST`` or ``srun``, so nothing
of mwhelpers needs to be installed where it runs: only the Python that runs
the task.  Standard library only.

Protocol (declared in ``wire.py``, which the kernel sends before this file: see
``mwhelpers.backends.agent.AGENT_CODE``):

* standard input, first line: the header (:func:`wire.read_header`): ``argv`` (the task's
  command, where ``{dir}`` stands for a private temporary folder, and a first word
  ``{python}`` for the Python that runs this agent), ``env`` (variables to
  set), ``cwd``, ``files`` (name -> text, written into that folder: the worker bootstrap, a
  cell's code) and ``port`` (checked free before starting, or null), ``heartbeat`` (seconds,
  or null: see below), ``escalation`` (how the agent ends the task by itself, below) and
  ``exit_record`` (the name of the variable that tells the worker bootstrap where to write how
  the program ended, or null: the agent points it at a file in that folder and sends the file
  back when the task has ended).  A header of another protocol version is refused
  (``bad-header``), never misread;
* standard input, then: one command per line (:class:`wire.Command`): ``signal N`` (to the
  task's process group), ``dump`` (Python stacks into the log: a byte on the task's pipe
  ``MWHELPERS_DUMP_FD``, which its start-up's dump thread reads), ``dump-signal`` (the same
  by SIGUSR1, for a task whose dump thread cannot run; not sent where the task has no
  handler for it, which it would end), ``end STEPS`` (escalate through those signals until
  the group is gone), ``ping`` (answered with a ``pong`` report), ``release`` (a task started
  with ``standby`` true in the header, waiting on the pipe ``MWHELPERS_STANDBY_FD`` after
  importing TensorFlow, runs its program: its port is checked then, not at the start, since
  the attempt it stands by for still holds it).  End of file means the kernel or the
  connection is gone: the group is ended through the header's ``escalation``.  SIGHUP,
  SIGTERM and SIGINT to the agent mean the same, but the group is sent SIGKILL at once (no
  waiting in a signal handler);
* heartbeat: the kernel pings several times per ``heartbeat`` seconds.  A
  network that goes silent (a cable, a switch, a paused VM: no FIN, no RST)
  never ends standard input, so when the agent has heard nothing for
  ``heartbeat`` seconds it ends the group through the header's ``escalation``
  by itself and says why in the log;
* the task's output (stdout and stderr together) is the agent's standard
  output, so it reaches the kernel's log file as it is written;
* the agent's own reports go to standard error, one per line (:class:`wire.Report`), each
  starting with ``@mwhelpers``: ``started PID HOSTNAME``, ``ended SIGNAME``, ``pong``,
  ``record JSON`` (the exit record the task wrote, on one line, before its ``exit``),
  ``exit CODE`` (negative: killed by that signal, as ``subprocess`` says), ``bad-header WHY``.

When the task's leader exits, what is left of its process group is killed,
so nothing outlives the task on that machine.

Warm starts (see ``mwhelpers.backends.warmhosts``): a header with ``serve`` makes this agent its
host's warm server for one cluster.  It starts a warm-start server (``_bootstrap.py --zygote``,
which imports TensorFlow once), reports ``warm`` with what the import did (or ``cold WHY``),
and passes every request that arrives on the abstract socket ``serve`` names, with its
descriptors, on to that server.  It ends when its input ends or the kernel has been silent for
``heartbeat`` seconds, once the server's tasks have ended.  A task's header with ``warm`` (that
name) has its task forked there instead of started afresh: the agent passes its own standard
output as the task's log, its dump pipe and a guard pipe whose end of file (this agent gone,
even by SIGKILL) ends the task; the server says the task's pid and, later, its exit code.
Where that fails the agent reports ``cold WHY`` and starts the task afresh.
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
from collections.abc import Iterable
from types import FrameType
from typing import Any

try:
    from . import wire
except ImportError:  # run as ``python -c`` (AGENT_CODE): the kernel defined ``wire`` first
    wire = globals()["wire"]

FORK_TIMEOUT = 60.0  # seconds a forked task may take to say its pid (milliseconds, usually)
READY_TIMEOUT = 180.0  # seconds a warm server may take to import TensorFlow
MAX_MESSAGE = 1 << 22
PORT_TAKEN = ("port {port} is already in use on this host; define the cluster again to get "
              "new ports")


def report(kind: wire.Report, *words: object) -> None:
    sys.stderr.write(wire.report(kind, *words) + "\n")
    sys.stderr.flush()


def say(text: str) -> None:
    """A line for the task's log (the agent's own explanation of a failure)."""
    sys.stdout.write(f"[mwhelpers agent on {socket.gethostname()}] {text}\n")
    sys.stdout.flush()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def catches_sigusr1(pid: int) -> bool | None:
    """Whether ``pid`` handles SIGUSR1 (``SigCgt`` in ``/proc/PID/status``); None: unknown.
    (As ``mwhelpers.proctree.catches``: this file imports nothing of the package.)"""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def _die_with_parent() -> None:
    # The task's leader gets SIGKILL should the agent itself die.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


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


def fork_warm(name: str, args: list[str], env: dict[str, str], cwd: str,
              passed: dict[str, int]) -> Forked | str:
    """Have the warm server on the abstract socket ``name`` fork the bootstrap with ``args``
    (its log: this agent's standard output; ``passed``: descriptors by the variable that will
    name each); the task, or why not."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        request = wire.fork_message(wire.Fork.TASK, argv=args, env=env, cwd=cwd,
                                    **{"pass": list(passed)})
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(FORK_TIMEOUT)
            conn.connect("\0" + name)
            if not _same_user(conn):  # (its name was taken by another user's process)
                raise OSError(f"the socket {name} belongs to another user")
            socket.send_fds(conn, [request], [theirs.fileno(), 1, *passed.values()])
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


class Agent:
    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        # how it ends the task by itself (the kernel gone or silent): the kernel's escalation
        self.lost_steps = wire.parse_steps(header["escalation"])
        self.child: subprocess.Popen[bytes] | Forked | None = None
        self.guard_fd: int | None = None  # a forked task's guard pipe (its end: this agent's)
        self.folder: str | None = None  # its private folder (a spare's: made before its header)
        self.lock = threading.Lock()  # one ending at a time; the exit report waits for it
        self.exited = threading.Event()
        self.heard = time.monotonic()  # when the kernel last said anything
        self.record: str | None = None  # where the task writes its exit record (exit_record)

    def start(self) -> int | None:
        h = self.header
        folder = self.folder = self.folder or tempfile.mkdtemp(prefix="mwhelpers-task-")
        write_files(folder, h.get("files", {}))
        argv = [a.replace("{dir}", folder) for a in h["argv"]]
        if argv[:1] == [wire.THIS_PYTHON]:
            argv[0] = sys.executable
        # mwhelpers' own variables come from the header only (srun passes on the
        # kernel's whole environment, including its session mark).
        env = {k: v for k, v in os.environ.items() if not k.startswith("MWHELPERS_")}
        env.update(h.get("env", {}))
        cwd = h.get("cwd") or os.getcwd()
        if not os.path.isdir(cwd):
            say(f"the working directory {cwd} does not exist here; create it on every host "
                "(a shared home does this) or give the cluster another one (cwd=...)")
            return 127
        if not os.path.exists(argv[0]):
            say(f"no Python at {argv[0]} on this host; install the same environment on every "
                "host or name the interpreter for this cluster (python=...)")
            return 127
        script = h.get("script")
        if script and not os.path.isfile(os.path.join(cwd, script)):
            say(f"the program {script} is not on this host; tasks run it by its path, so keep "
                "it in a folder every host shares (a shared home) or copy it there first")
            return 127
        if h.get("exit_record"):  # the start-up writes how the program ended here
            self.record = env[h["exit_record"]] = os.path.join(folder, "exit.json")
        port = h.get("port")
        fds: tuple[int, ...] = ()
        self.release_fd: int | None = None
        if h.get("standby"):  # it waits for a byte on this pipe ("release")
            read_end, self.release_fd = os.pipe()
            os.set_inheritable(self.release_fd, False)
            env[wire.Env.STANDBY_FD] = str(read_end)
            fds = (read_end,)
        elif port and port_taken(int(port)):
            say(PORT_TAKEN.format(port=port))
            return 1
        dump_read, self.dump_fd = os.pipe()  # a byte: the task writes its stacks ("dump")
        os.set_inheritable(self.dump_fd, False)
        os.set_blocking(self.dump_fd, False)
        env[wire.Env.DUMP_FD] = str(dump_read)
        fds = (*fds, dump_read)
        if h.get("warm") and not h.get("standby"):
            self.child = self.fork(h["warm"], argv[3:], env, cwd, dump_read)
        if self.child is None:
            self.child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=_die_with_parent, pass_fds=fds)
        for fd in fds:
            os.close(fd)
        report(wire.Report.STARTED, self.child.pid, socket.gethostname())
        return None

    def fork(self, name: str, args: list[str], env: dict[str, str], cwd: str,
             dump_read: int) -> Forked | None:
        """The task forked by the warm server ``name`` (``args``: the bootstrap's), or None
        (said in a ``cold`` report): start it afresh."""
        guard_read, guard = os.pipe()
        os.set_inheritable(guard, False)
        env = {k: v for k, v in env.items() if k != wire.Env.DUMP_FD}
        forked = fork_warm(name, args, env, cwd,
                           {wire.Env.DUMP_FD: dump_read, wire.Env.GUARD_FD: guard_read})
        os.close(guard_read)
        if isinstance(forked, Forked):
            self.guard_fd = guard
            return forked
        os.close(guard)
        report(wire.Report.COLD, forked)
        return None

    def dump(self, child: subprocess.Popen[bytes] | Forked, by_signal: bool) -> None:
        """Have the task write its stacks: through its dump thread, or by SIGUSR1."""
        if not by_signal:
            try:
                os.write(self.dump_fd, b"d")
                return
            except OSError:  # full, or the task closed its end
                pass
        if catches_sigusr1(child.pid) is not False:  # (SIGUSR1 would end it otherwise)
            os.kill(child.pid, signal.SIGUSR1)

    def release(self) -> None:
        """Let a standby run its program (b"x" instead: its port is taken, said in the log,
        and the task exits with 1, as a task started with a port taken would)."""
        fd, self.release_fd = self.release_fd, None
        if fd is None:
            return
        port = self.header.get("port")
        taken = port is not None and port_taken(int(port))
        if taken:
            say(PORT_TAKEN.format(port=port))
        os.write(fd, b"x" if taken else b"1")
        os.close(fd)

    def end(self, steps: Iterable[tuple[int, float]]) -> None:
        """Escalate through ``steps`` [(signal, seconds)] until the group is gone."""
        with self.lock:
            if self.child is None:
                return
            pgid = self.child.pid
            for sig, seconds in steps:
                if self.exited.is_set() and not group_alive(pgid):
                    return
                kill_group(pgid, sig)
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    if self.exited.wait(0.02) and not group_alive(pgid):
                        report(wire.Report.ENDED, signal.Signals(sig).name)
                        return

    def commands(self) -> None:
        child = self.child
        assert child is not None  # read once the task has started
        for line in sys.stdin:
            self.heard = time.monotonic()
            parsed = wire.parse_command(line)
            if parsed is None:
                continue
            verb, argument = parsed
            try:
                if verb is wire.Command.PING:
                    report(wire.Report.PONG)
                elif verb is wire.Command.SIGNAL:
                    kill_group(child.pid, int(argument))
                elif verb in (wire.Command.DUMP, wire.Command.DUMP_BY_SIGNAL):
                    self.dump(child, by_signal=verb is wire.Command.DUMP_BY_SIGNAL)
                elif verb is wire.Command.RELEASE:
                    self.release()
                elif verb is wire.Command.END:
                    threading.Thread(target=self.end, args=(wire.parse_steps(argument),),
                                     daemon=True).start()
            except (OSError, ValueError, IndexError):
                pass
        # End of input: the kernel, or the connection to it, is gone.
        self.end(self.lost_steps)

    def watch_heartbeat(self, limit: float) -> None:
        """Kill the group once the kernel has been silent for ``limit`` seconds."""
        while not self.exited.wait(min(1.0, limit / 4)):
            silent = time.monotonic() - self.heard
            if silent > limit:
                say(f"no word from the kernel for {silent:.0f} s (its machine or the network "
                    "between stopped answering): ending the task here")
                self.end(self.lost_steps)
                return

    def run(self) -> int:
        code = self.start()
        if code is not None:
            return code
        child = self.child
        assert child is not None  # start() returns None once it has started the task
        threading.Thread(target=self.commands, daemon=True).start()
        limit = self.header.get("heartbeat")
        if limit:
            self.heard = time.monotonic()
            threading.Thread(target=self.watch_heartbeat, args=(float(limit),), daemon=True).start()
        code = child.wait()
        self.exited.set()
        with self.lock:
            if group_alive(child.pid):  # helpers left behind by the task
                kill_group(child.pid, signal.SIGKILL)
        self.send_record()
        return code

    def send_record(self) -> None:
        """The exit record the task wrote, if any, as one ``record`` report."""
        if not self.record:
            return
        try:
            with open(self.record) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return
        report(wire.Report.RECORD, json.dumps(record))


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


def serve(h: dict[str, Any]) -> int:
    """Be the host's warm server (``serve`` in the header: see the module's text)."""
    folder = tempfile.mkdtemp(prefix="mwhelpers-warm-")
    zygote: subprocess.Popen[bytes] | None = None
    ctl = listener = None
    served = False
    try:
        write_files(folder, h.get("files", {}))
        python = sys.executable if h["argv"][0] == wire.THIS_PYTHON else h["argv"][0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MWHELPERS_")}
        env.update(h.get("env", {}))
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The blank argument leaves room to show each task's own command line.
        zygote = subprocess.Popen(
            [python, "-u", os.path.join(folder, "_bootstrap.py"), "--zygote",
             str(theirs.fileno()), h.get("first") or "tensorflow", " " * 4096],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, cwd=h.get("cwd") or None, start_new_session=True,
            preexec_fn=_die_with_parent, pass_fds=(theirs.fileno(),))
        theirs.close()
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


def main() -> int:
    # Until its task starts, a signal ends this agent through its clean-up (a spare's files)
    for s in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.default_int_handler)
    folder = None
    try:
        line = sys.stdin.readline()
        if line.startswith(wire.PRELOAD):  # a spare: the start-up's files, ahead of its task
            folder = tempfile.mkdtemp(prefix="mwhelpers-task-")
            write_files(folder, wire.read_preload(line))
            line = sys.stdin.readline()
        if not line:  # a spare whose kernel never used it
            return 0
        header = wire.read_header(line)
        if header.get("serve"):
            return serve(header)
        agent = Agent(header)
        agent.folder = folder
        folder = None  # (the agent's to remove)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        report(wire.Report.BAD_HEADER, f"{e}: {line[:200]!r}")
        return 2
    except KeyboardInterrupt:  # a signal before its task started
        return 1
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)

    # the same as end of input, without waiting in a handler
    def on_signal(signum: int, frame: FrameType | None) -> None:
        if agent.child is not None:
            kill_group(agent.child.pid, signal.SIGKILL)
        report(wire.Report.EXIT, -signal.SIGKILL)
        os._exit(128 + signum)

    for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    try:
        code = agent.run()
    finally:
        if agent.folder:
            shutil.rmtree(agent.folder, ignore_errors=True)
    report(wire.Report.EXIT, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
