"""Warm starts on other hosts: what makes a launch over SSH, Slurm or Ray as quick as a local one.

A local task is forked from a process that imported TensorFlow already
(:mod:`mwhelpers.warmstart`).  A remote task pays two more costs: its transport (an SSH
connection is about 0.27 s here, a Ray relay about 3 s) and a fresh ``import tensorflow`` on its
host (about 3 CPU-s).  When a cluster of an agent backend is defined, :class:`WarmHosts` starts,
in the background:

* on each host, a **warm server**: an agent given a ``serve`` header (``taskside/_agent.py``)
  that runs the same warm-start server as the local backend, importing TensorFlow once in the
  environment the cluster's tasks get (what :data:`~mwhelpers.warmstart.PER_TASK` names aside),
  and forks the tasks whose agents connect to it;
* for each task, a **spare**: the transport with an agent in it, which writes the start-up's files
  and waits for a task's header. A launch takes the spare of its host, so no connection is made
  and no files are sent then; a new spare replaces it a second later, once the task is under way.

Under Slurm a task forked by a host's server would live in that server's job step (its CPUs,
memory, accounting and end), so there each spare starts a warm-start server of its own instead
(a ``serve`` in its preload) and its task is forked there, in the spare's own step.

A task is forked where its program and environment would import as that server did (the same
rules as a local warm start: :func:`mwhelpers.warmstart.cold_reason`, ``same_import``), else
started afresh by its agent, which says why in a ``cold`` report.  Neither is used with
``MWHELPERS_WARM_HOSTS=0`` (or ``MWHELPERS_WARM_START=0``) in the kernel's environment, nor by a
launcher that starts nothing ahead (``standby`` false: Ray bundles with GPUs).  Everything ends
with the launcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from .. import proctree, settings
from ..ending import end
from ..taskside import wire
from ..warmstart import (
    PER_TASK,
    ImportEffects,
    cold_reason,
    folder_matters,
    imported_first,
    same_import,
    server_env,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from .base import LaunchSpec


class Transports(Protocol):
    """What :class:`WarmHosts` uses of its launcher (an ``AgentLauncher``)."""

    python: str
    cwd: str
    heartbeat: float

    @property
    def host_info(self) -> Mapping[str, Any]: ...

    @property
    def warm_servers(self) -> bool: ...

    def transport(self, host: str, argv: list[str]) -> list[str]: ...

    def machine_of(self, host: str) -> str: ...


class ServerReports:
    """What the agent of a warm-start server (a host's, or a spare's own) said of it: ready,
    with the fields of its import, or why not."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, env: dict[str, str],
                 cwd: str, first: str) -> None:
        """``name``: what a task's header names it by; ``env``, ``cwd``, ``first``: what its
        import gets."""
        self.popen, self.name, self.env, self.cwd, self.first = popen, name, env, cwd, first
        self.fields: dict[str, Any] | None = None  # its ready message, once it is ready
        self.error: str | None = None
        self.done = threading.Event()  # ready, or failed

    def note(self, line: str) -> bool:
        """Take one line of its agent's reports; True when it said ``warm`` or ``cold``."""
        said = wire.parse_report(line)
        if said is None or said[0] not in (wire.Report.WARM, wire.Report.COLD,
                                           wire.Report.BAD_HEADER):
            return False
        if said[0] is wire.Report.WARM:
            self.fields = json.loads(said[1])
        else:
            self.error = said[1]
        self.done.set()
        return True

    def gone(self, last: list[str]) -> None:
        """Its agent's reports ended before it said either."""
        if not self.done.is_set():
            code = self.popen.wait()
            self.error = f"its agent ended (exit code {code})" + (
                ": " + " / ".join(last) if last else "")
            self.done.set()

    def read(self, stderr: IO[bytes], until_answer: bool) -> None:
        """Read its agent's reports from ``stderr``: to their end, or (``until_answer``) only up
        to its ``warm`` or ``cold``, leaving the rest to another reader; the last other lines
        explain an agent that ended before it answered."""
        last: list[str] = []
        try:
            for raw in stderr:
                line = raw.decode(errors="replace").rstrip("\n")
                if self.note(line):
                    if until_answer:
                        return
                elif wire.parse_report(line) is None:
                    last = [*last[-4:], line]
        except (OSError, ValueError):  # (closed by the launcher's close)
            pass
        self.gone(last)

    def ready(self, timeout: float) -> bool:
        """Whether it is ready, waiting for its import up to ``timeout`` seconds."""
        self.done.wait(timeout)
        return self.fields is not None and self.popen.poll() is None

    @property
    def effects(self) -> ImportEffects:
        f = self.fields or {}
        return ImportEffects(dict(f.get("env_set") or {}), frozenset(f.get("env_unset") or ()),
                             bool(f.get("jax", True)))


class HostServer(ServerReports):
    """One host's warm server: the transport that runs its agent (``serve`` header)."""

    def __init__(self, name: str, command: list[str], header: str, env: dict[str, str],
                 cwd: str, first: str, heartbeat: float | None,
                 transport_env: dict[str, str]) -> None:
        """``name``: its abstract socket's; ``env``, ``cwd``, ``first``: what its import gets
        (also in ``header``, what its agent reads)."""
        self.closed = threading.Event()
        popen = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 env=transport_env)
        super().__init__(popen, name, env, cwd, first)
        # Its header, then its pings: from a thread, as the spares' files are (ssh reads its
        # input only once connected).
        threading.Thread(target=self._talk, args=(header, heartbeat), daemon=True,
                         name="mwhelpers-warm-host").start()
        assert popen.stderr is not None
        threading.Thread(target=self.read, args=(popen.stderr, False), daemon=True,
                         name="mwhelpers-warm-reports").start()

    def _talk(self, header: str, heartbeat: float | None) -> None:
        _send_line(self.popen, header)
        while heartbeat and not self.closed.wait(heartbeat / 4):
            _send_line(self.popen, wire.command(wire.Command.PING))

    def close(self) -> None:
        """End its input (its server stops forking and leaves after its tasks), then its
        transport's group."""
        self.closed.set()
        end_transports([self.popen])


class Spare:
    """A transport with an agent in it that waits for a task's header; its first line (the
    start-up's files) is sent by a thread of its own, since a pipe holds less and ssh reads
    it only once connected.  With ``serve`` (env, cwd, first) its agent starts a warm-start
    server of its own meanwhile (``server``), whose ``warm`` or ``cold`` report a thread reads
    off the agent's reports; the task's agent process reads the rest."""

    def __init__(self, command: list[str], preload: str, env: dict[str, str],
                 serve: dict[str, Any] | None = None) -> None:
        self.env = env  # the transport's environment (srun passes it all on to the agent)
        self.popen = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True, env=env)
        self.sent = False
        self.writer = threading.Thread(target=self._send, args=(preload,), daemon=True,
                                       name=f"mwhelpers-spare-{self.popen.pid}")
        self.writer.start()
        self.server: ServerReports | None = None
        self.reader: threading.Thread | None = None
        if serve is not None:
            self.server = ServerReports(self.popen, wire.OWN_SERVER, serve["env"], serve["cwd"],
                                        serve["first"])
            assert self.popen.stderr is not None  # (the task's agent process reads on)
            self.reader = threading.Thread(target=self.server.read,
                                           args=(self.popen.stderr, True), daemon=True,
                                           name=f"mwhelpers-spare-reports-{self.popen.pid}")
            self.reader.start()

    def _send(self, line: str) -> None:
        self.sent = _send_line(self.popen, line)

    def usable(self, env: dict[str, str], wait: float) -> bool:
        """Whether its files went and its agent waits, in the environment a transport started
        now would have (``env``), and its own server, if any, said whether it is ready: waiting
        up to ``wait`` seconds for each."""
        self.writer.join(wait)
        if self.reader is not None:
            self.reader.join(wait)
        return (not self.writer.is_alive() and self.sent and self.popen.poll() is None
                and env == self.env and not (self.reader and self.reader.is_alive()))


class WarmHosts:
    """The warm servers and spare agents of one agent launcher (see the module's text)."""

    READY_WAIT = 60.0  # seconds a launch waits for its host's server to finish its import
    SPARE_WAIT = 15.0  # seconds a launch waits for a spare's transport to take its files
    SPARE_AFTER = 1.0  # seconds after a launch that its spare's successor starts

    def __init__(self, launcher: Transports, agent_code: str,
                 files: Callable[[], dict[str, str]],
                 transport_env: Callable[[], dict[str, str]]) -> None:
        """``agent_code``: what ``python -c`` runs there; ``files``: what a task's start-up
        loads; ``transport_env``: the environment of ssh, srun or a relay here (all three
        :mod:`mwhelpers.backends.agent`'s)."""
        self.launcher = launcher
        self.command = [launcher.python, "-c", agent_code]
        self.files = files
        self.transport_env = transport_env
        self.servers: dict[str, HostServer] = {}  # by machine (the launcher's machine_of)
        self.spares: dict[str, list[Spare]] = {}  # by host
        self.last_cold_reason: str | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()  # (the spares' pings stop)
        self._pinging = False
        self._id = uuid.uuid4().hex[:16]
        self._preloads: dict[str, str] = {}  # each host's spares' first line (made once)
        self._own: dict[str, dict[str, Any]] = {}  # what a host's spares' own servers import

    @staticmethod
    def enabled(environ: Mapping[str, str] | None = None) -> bool:
        return (sys.platform == "linux" and settings.WARM_START.read(environ)
                and settings.WARM_HOSTS.read(environ))

    def prepare(self, envs: Mapping[str, list[dict[str, str]]]) -> None:
        """Start a warm server on each host of ``envs`` ({host: the environments of its
        tasks}; the first is the server's, without :data:`PER_TASK`) and a spare for each
        task."""
        launcher = self.launcher
        for host, task_envs in envs.items():
            machine = launcher.machine_of(host)
            env = {k: v for k, v in task_envs[0].items() if k not in PER_TASK}
            first = ("tensorflow" if env.get("KERAS_BACKEND", "tensorflow") == "tensorflow"
                     else "keras")
            if not launcher.warm_servers:  # each spare starts its own
                self._own[host] = {"env": env, "cwd": launcher.cwd, "first": first}
            elif machine not in self.servers:
                name = f"mwhelpers-warm-{self._id}-{len(self.servers)}"
                header = wire.header(
                    serve=name, argv=[launcher.python], env=env, cwd=launcher.cwd,
                    files=self.files(), first=first, heartbeat=launcher.heartbeat or None,
                    escalation="9:0")
                self.servers[machine] = HostServer(
                    name, launcher.transport(host, self.command), header, env, launcher.cwd,
                    first, launcher.heartbeat or None, self.transport_env())
            for _ in task_envs:
                self._add_spare(host)
        if launcher.heartbeat and not self._pinging:
            self._pinging = True
            threading.Thread(target=self._ping_spares, args=(launcher.heartbeat / 4,),
                             daemon=True, name="mwhelpers-spare-pings").start()

    def _ping_spares(self, every: float) -> None:
        """Ping every waiting spare, whose agent ends itself after the heartbeat's silence (a
        spare that was taken meanwhile may get one more: its agent answers it)."""
        while not self._closing.wait(every):
            with self._lock:
                spares = [spare for ss in self.spares.values() for spare in ss]
            for spare in spares:
                if spare.sent and not spare.writer.is_alive():
                    _send_line(spare.popen, wire.command(wire.Command.PING))

    def _add_spare(self, host: str) -> None:
        with self._lock:
            if self._closed:
                return
            own = self._own.get(host)
            if host not in self._preloads:
                self._preloads[host] = wire.preload(self.files(), serve=own,
                                                    heartbeat=self.launcher.heartbeat or None)
            spare = Spare(self.launcher.transport(host, self.command), self._preloads[host],
                          self.transport_env(), serve=own)
            self.spares.setdefault(host, []).append(spare)

    def take(self, host: str, standby: bool = False) -> Spare | None:
        """A spare on ``host``, its agent waiting for a header; None: there is none to use.
        The host's server (or the spare's own) is waited for here, while the spares are still
        in the pool and pinged, so that the launch then decides at once; a ``standby``, which
        imports by itself, waits for no import and leaves the spares still importing.  Each
        spare taken or given up is replaced."""
        server = self.servers.get(self.launcher.machine_of(host))
        if server is not None and not standby:
            server.ready(self.READY_WAIT)
        with self._lock:
            candidates = list(self.spares.get(host, []))
        env, found, removed = self.transport_env(), None, 0
        for spare in candidates:
            if standby and spare.reader is not None and spare.reader.is_alive():
                continue  # (its own server still imports: left for a task it can fork)
            usable = spare.usable(env, self.SPARE_WAIT if spare.server is None else self.READY_WAIT)
            with self._lock:
                pool = self.spares.get(host, [])
                if spare not in pool:  # (another launch took it, or the launcher closed)
                    continue
                pool.remove(spare)
            removed += 1
            if usable:
                found = spare
                break
            close_spare(spare.popen)
        # Successors start once this launch's task is under way: a new transport (ssh's key
        # exchange, an sshd, a Ray driver) and its agent's Python start would take CPU from the
        # task's own start (ssh: 80 ms to ready for the second of two tasks, 40 ms with this).
        for _ in range(removed if candidates else 1):
            later = threading.Timer(self.SPARE_AFTER, self._add_spare, args=(host,))
            later.daemon, later.name = True, "mwhelpers-new-spare"
            later.start()
        return found

    def warm_name(self, spec: LaunchSpec, spare: Spare | None) -> str | None:
        """The name of the warm server ``spec``'s task forks from (its host's, or
        :data:`wire.OWN_SERVER`: ``spare``'s own); None: its agent starts it afresh
        (``last_cold_reason`` says why)."""
        self.last_cold_reason = None
        server = (self.servers.get(self.launcher.machine_of(spec.host or ""))
                  if self.launcher.warm_servers else spare.server if spare else None)
        why = self._cold(spec, server)
        self.last_cold_reason = why
        return None if why or server is None else server.name

    def _cold(self, spec: LaunchSpec, server: ServerReports | None) -> str | None:
        if server is None:
            return ("its host has no warm server" if self.launcher.warm_servers else
                    "no spare with a warm server of its own was ready")
        if spec.standby:
            return "a standby imports TensorFlow itself"
        try:
            source = Path(spec.script).read_text(errors="replace")
        except OSError as e:
            return f"its program could not be read here ({e})"
        if not server.ready(self.READY_WAIT):
            whose = "its host's" if isinstance(server, HostServer) else "its spare's own"
            return f"{whose} warm server is not ready (" + (
                server.error or ("it ended" if server.popen.poll() is not None
                                 else f"still importing after {self.READY_WAIT:g} s")) + ")"
        gpu_build = bool((server.fields or {}).get("gpu_build", True))
        why = cold_reason(source, spec.env, gpu_build=gpu_build)
        if why:
            return why
        at_import = server_env(source, spec.env)
        if imported_first(source, at_import) != server.first:
            return f"it imports {imported_first(source, at_import)} first, its server did not"
        if folder_matters(at_import) and spec.cwd != server.cwd:
            return "its folder changes its import (a relative PYTHONPATH) and differs"
        if not same_import(server.env, server.effects, at_import, gpu_build):
            return "its environment differs from its host's warm server's where the import reads it"
        return None

    def close(self) -> None:
        """End every spare and server (the tasks are the launcher's to end, before)."""
        self._closing.set()
        with self._lock:
            self._closed = True
            spares = [spare for ss in self.spares.values() for spare in ss]
            self.spares = {}
        for spare in spares:  # one still sending its files: its writer holds its input
            if spare.writer.is_alive():
                end(local=proctree.group(spare.popen.pid, spare.popen.poll() is None))
        for server in self.servers.values():
            server.closed.set()
        end_transports([*(s.popen for s in spares), *(s.popen for s in self.servers.values())])
        for spare in spares:  # (a server's is read to its end by its own thread)
            if spare.reader is not None:
                spare.reader.join(5)
            if spare.popen.stderr is not None:
                spare.popen.stderr.close()


def _send_line(popen: subprocess.Popen[bytes], line: str) -> bool:
    """Whether ``line`` went to ``popen``'s input (not: it ended, or was closed)."""
    try:
        assert popen.stdin is not None
        popen.stdin.write(line.encode() + b"\n")
        popen.stdin.flush()
        return True
    except (OSError, ValueError):
        return False


def close_spare(popen: subprocess.Popen[bytes]) -> None:
    """End a spare's transport, and close its pipes."""
    end_transports([popen])
    if popen.stderr is not None:
        popen.stderr.close()


def end_transports(popens: list[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """End spares' and servers' transports: their input ends at once (an agent then leaves:
    a spare at once, a server once its tasks have ended), then, after ``grace`` seconds, the
    group of each that is still there."""
    for popen in popens:
        try:
            if popen.stdin is not None:
                popen.stdin.close()
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for popen in popens:
        try:
            popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            end(local=proctree.group(popen.pid, popen.poll() is None))
            popen.wait()
        if popen.stdout is not None:
            popen.stdout.close()


def pump(source: IO[bytes], fd: int) -> None:
    """Copy a spare's output (its task's) into the log ``fd`` until it ends; closes both."""
    try:
        while True:
            chunk = os.read(source.fileno(), 1 << 16)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
    except OSError:
        pass
    finally:
        os.close(fd)
        source.close()
