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
Where that fails the agent reports ``cold WHY`` and starts the task afresh.  A spare whose
preload has ``serve`` starts a warm-start server of its own while it waits (:class:`OwnServer`,
reporting ``warm`` or ``cold`` likewise), and a header with ``warm`` :data:`wire.OWN_SERVER`
has its task forked there: so the task stays in the spare's own Slurm job step.
"""

from __future__ import annotations  # never evaluated: the host's Python may be older than 3.10

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

try:
    from . import agentwarm as agentwarm
    from . import wire
except ImportError:  # run as ``python -c`` (AGENT_CODE): the kernel defined both first
    wire, agentwarm = globals()["wire"], globals()["agentwarm"]
report, write_files, die_with_parent = (agentwarm.report, agentwarm.write_files,
                                        agentwarm.die_with_parent)
PORT_TAKEN = ("port {port} is already in use on this host; define the cluster again to get "
              "new ports")


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


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


class Agent:
    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        # how it ends the task by itself (the kernel gone or silent): the kernel's escalation
        self.lost_steps = wire.parse_steps(header["escalation"])
        self.child: subprocess.Popen[bytes] | agentwarm.Forked | None = None
        self.guard_fd: int | None = None  # a forked task's guard pipe (its end: this agent's)
        self.folder: str | None = None  # its private folder (a spare's: made before its header)
        self.lock = threading.Lock()  # one ending at a time; the exit report waits for it
        self.exited = threading.Event()
        self.heard = time.monotonic()  # when the kernel last said anything
        self.record: str | None = None  # where the task writes its exit record (exit_record)
        self.own: agentwarm.OwnServer | None = None  # a spare's own warm server, if any

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
        warm = h.get("warm") if not h.get("standby") else None
        if self.own is not None and warm != wire.OWN_SERVER:
            self.own.drop()  # (its import is not this task's)
        if warm == wire.OWN_SERVER:
            ctl = self.own.take() if self.own is not None else None
            if ctl is None:
                report(wire.Report.COLD, f"its own warm server: {self.own.why}"
                       if self.own is not None else "this agent started no warm server of its own")
            else:
                self.child = self.fork(ctl, argv[3:], env, cwd, dump_read)
        elif warm:
            self.child = self.fork(warm, argv[3:], env, cwd, dump_read)
        if self.child is None and self.own is not None:
            self.own.drop()  # (a fresh start imports by itself)
        if self.child is None:
            self.child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=die_with_parent, pass_fds=fds)
        for fd in fds:
            os.close(fd)
        report(wire.Report.STARTED, self.child.pid, socket.gethostname())
        return None

    def fork(self, server: str | socket.socket, args: list[str], env: dict[str, str], cwd: str,
             dump_read: int) -> agentwarm.Forked | None:
        """The task forked by a warm server (the host's, by name, or this spare's own: see
        :func:`fork_warm`; ``args``: the bootstrap's), or None (said in a ``cold`` report):
        start it afresh."""
        guard_read, guard = os.pipe()
        os.set_inheritable(guard, False)
        env = {k: v for k, v in env.items() if k != wire.Env.DUMP_FD}
        forked = agentwarm.fork_warm(server, args, env, cwd,
                           {wire.Env.DUMP_FD: dump_read, wire.Env.GUARD_FD: guard_read})
        os.close(guard_read)
        if isinstance(forked, agentwarm.Forked):
            self.guard_fd = guard
            return forked
        os.close(guard)
        report(wire.Report.COLD, forked)
        return None

    def dump(self, child: subprocess.Popen[bytes] | agentwarm.Forked, by_signal: bool) -> None:
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


def await_header(heartbeat: float | None, folder: str,
                 own: agentwarm.OwnServer | None) -> str:
    """A spare's next line that is not a ``ping`` ('' at the end of its input).  With a
    ``heartbeat``, a spare that has heard nothing for that long (its kernel, or the network to
    it, gone silent) says so, removes its folder, ends its own server and exits; a line read
    once it has decided that counts as the end of its input."""
    state = {"heard": time.monotonic(), "done": False}
    lock = threading.Lock()

    def watch(limit: float) -> None:
        while True:
            time.sleep(limit / 4)
            with lock:
                if state["done"]:
                    return
                silent = time.monotonic() - state["heard"]
                if silent > limit:
                    report(wire.Report.COLD, f"a spare that heard nothing for {silent:.0f} s "
                           "ends itself")
                    if own is not None:
                        own.drop()
                    shutil.rmtree(folder, ignore_errors=True)
                    os._exit(0)  # (under the lock: no line is taken meanwhile)

    if heartbeat:
        threading.Thread(target=watch, args=(heartbeat,), daemon=True).start()
    while True:
        line = sys.stdin.readline()
        with lock:
            state["heard"] = time.monotonic()
            parsed = wire.parse_command(line) if line else None
            if parsed is None or parsed[0] is not wire.Command.PING:
                state["done"] = True
                return line


def main() -> int:
    # Until its task starts, a signal ends this agent through its clean-up (a spare's files)
    for s in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.default_int_handler)
    folder = None
    own: agentwarm.OwnServer | None = None
    try:
        line = sys.stdin.readline()
        if line.startswith(wire.PRELOAD):  # a spare: the start-up's files, ahead of its task
            folder = tempfile.mkdtemp(prefix="mwhelpers-task-")
            spare = wire.read_preload(line)
            write_files(folder, spare["files"])
            if spare["serve"] is not None:
                try:
                    own = agentwarm.OwnServer(folder, spare["serve"])
                except OSError as e:  # (its task then starts afresh, in this spare)
                    report(wire.Report.COLD, f"{type(e).__name__}: {e}")
            line = await_header(spare["heartbeat"], folder, own)
        if not line:  # a spare whose kernel never used it
            return 0
        header = wire.read_header(line)
        if header.get("serve"):
            return agentwarm.serve(header)
        agent = Agent(header)
        agent.folder, agent.own = folder, own
        folder = own = None  # (the agent's to remove)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        report(wire.Report.BAD_HEADER, f"{e}: {line[:200]!r}")
        return 2
    except KeyboardInterrupt:  # a signal before its task started
        return 1
    finally:
        if own is not None:
            own.drop()
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
        if agent.own is not None:
            agent.own.drop()
        if agent.folder:
            shutil.rmtree(agent.folder, ignore_errors=True)
    report(wire.Report.EXIT, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
