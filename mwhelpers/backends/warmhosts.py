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
  and no files are sent then; a new spare replaces it.

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

    def transport(self, host: str, argv: list[str]) -> list[str]: ...


class HostServer:
    """One host's warm server: the transport that runs its agent (``serve`` header)."""

    def __init__(self, name: str, command: list[str], header: str, env: dict[str, str],
                 cwd: str, first: str, heartbeat: float | None,
                 transport_env: dict[str, str]) -> None:
        """``name``: its abstract socket's; ``env``, ``cwd``, ``first``: what its import gets
        (also in ``header``, what its agent reads)."""
        self.name, self.env, self.cwd, self.first = name, env, cwd, first
        self.fields: dict[str, Any] | None = None  # its ready message, once it is ready
        self.error: str | None = None
        self.done = threading.Event()  # ready, or failed
        self.closed = threading.Event()
        self.popen = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True,
                                      env=transport_env)
        # Its header, then its pings: from a thread, as the spares' files are (ssh reads its
        # input only once connected).
        threading.Thread(target=self._talk, args=(header, heartbeat), daemon=True,
                         name="mwhelpers-warm-host").start()
        threading.Thread(target=self._read, daemon=True, name="mwhelpers-warm-reports").start()

    def _talk(self, header: str, heartbeat: float | None) -> None:
        _send_line(self.popen, header)
        while heartbeat and not self.closed.wait(heartbeat / 4):
            _send_line(self.popen, wire.command(wire.Command.PING))

    def _read(self) -> None:
        last: list[str] = []
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            said = wire.parse_report(line)
            if said is None:
                last = [*last[-4:], line]
            elif said[0] is wire.Report.WARM:
                self.fields = json.loads(said[1])
                self.done.set()
            elif said[0] in (wire.Report.COLD, wire.Report.BAD_HEADER):
                self.error = said[1]
                self.done.set()
        if not self.done.is_set():
            code = self.popen.wait()
            self.error = f"its agent ended (exit code {code})" + (
                ": " + " / ".join(last) if last else "")
            self.done.set()

    def ready(self, timeout: float) -> bool:
        """Whether it is ready, waiting for its import up to ``timeout`` seconds."""
        self.done.wait(timeout)
        return self.fields is not None and self.popen.poll() is None

    @property
    def effects(self) -> ImportEffects:
        f = self.fields or {}
        return ImportEffects(dict(f.get("env_set") or {}), frozenset(f.get("env_unset") or ()),
                             bool(f.get("jax", True)))

    def close(self) -> None:
        """End its input (its server stops forking and leaves after its tasks), then its
        transport's group."""
        self.closed.set()
        end_transports([self.popen])


class WarmHosts:
    """The warm servers and spare agents of one agent launcher (see the module's text)."""

    READY_WAIT = 180.0  # seconds a launch waits for its host's server to finish its import

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
        self.servers: dict[str, HostServer] = {}  # by the host's address
        # by host: each spare's transport, and the thread that sends it its files
        self.spares: dict[str, list[tuple[subprocess.Popen[bytes], threading.Thread]]] = {}
        self.last_cold_reason: str | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._id = uuid.uuid4().hex[:16]
        self._preload: str | None = None  # the spares' first line (made once)

    @staticmethod
    def enabled(environ: Mapping[str, str] | None = None) -> bool:
        return (sys.platform == "linux" and settings.WARM_START.read(environ)
                and settings.WARM_HOSTS.read(environ))

    def _address(self, host: str) -> str:
        info = self.launcher.host_info.get(host)
        return info["address"] if info else host

    def prepare(self, envs: Mapping[str, list[dict[str, str]]]) -> None:
        """Start a warm server on each host of ``envs`` ({host: the environments of its
        tasks}; the first is the server's, without :data:`PER_TASK`) and a spare for each
        task."""
        launcher = self.launcher
        for host, task_envs in envs.items():
            address = self._address(host)
            if address not in self.servers:
                env = {k: v for k, v in task_envs[0].items() if k not in PER_TASK}
                first = ("tensorflow" if env.get("KERAS_BACKEND", "tensorflow") == "tensorflow"
                         else "keras")
                name = f"mwhelpers-warm-{self._id}-{len(self.servers)}"
                header = wire.header(
                    serve=name, argv=[launcher.python], env=env, cwd=launcher.cwd,
                    files=self.files(), first=first, heartbeat=launcher.heartbeat or None,
                    escalation="9:0")
                self.servers[address] = HostServer(
                    name, launcher.transport(host, self.command), header, env, launcher.cwd,
                    first, launcher.heartbeat or None, self.transport_env())
            for _ in task_envs:
                self._add_spare(host)

    def _add_spare(self, host: str) -> None:
        with self._lock:
            if self._closed:
                return
            popen = subprocess.Popen(
                self.launcher.transport(host, self.command),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, env=self.transport_env())
            # Its agent writes the start-up's files while it waits (wire.preload); sent by a
            # thread, since a pipe holds less and ssh reads it only once connected.
            if self._preload is None:
                self._preload = wire.preload(self.files())
            writer = threading.Thread(target=_send_line, args=(popen, self._preload),
                                      daemon=True, name=f"mwhelpers-spare-{popen.pid}")
            writer.start()
            self.spares.setdefault(host, []).append((popen, writer))

    def take(self, host: str) -> subprocess.Popen[bytes] | None:
        """A spare's transport on ``host``, its agent waiting for a header (another spare
        replaces it); None: there is none alive."""
        with self._lock:
            spares = self.spares.get(host, [])
            while spares:
                popen, writer = spares.pop(0)
                writer.join()  # (at once, unless it is still connecting)
                if popen.poll() is None:
                    break
                _close_spare(popen)
            else:
                return None
        # its successor, started beside this launch (forking this process takes milliseconds)
        threading.Thread(target=self._add_spare, args=(host,), daemon=True,
                         name="mwhelpers-new-spare").start()
        return popen

    def warm_name(self, spec: LaunchSpec) -> str | None:
        """The name of the warm server ``spec``'s task forks from; None: its agent starts it
        afresh (``last_cold_reason`` says why)."""
        self.last_cold_reason = None
        server = self.servers.get(self._address(spec.host or ""))
        why = self._cold(spec, server)
        self.last_cold_reason = why
        return None if why or server is None else server.name

    def _cold(self, spec: LaunchSpec, server: HostServer | None) -> str | None:
        if server is None:
            return "its host has no warm server"
        if spec.standby:
            return "a standby imports TensorFlow itself"
        try:
            source = Path(spec.script).read_text(errors="replace")
        except OSError as e:
            return f"its program could not be read here ({e})"
        if not server.ready(self.READY_WAIT):
            return f"its host's warm server is not ready ({server.error or 'it is importing'})"
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

    @property
    def pids(self) -> list[int]:
        """The transports' pids (servers and spares) on this machine, while they run."""
        with self._lock:
            spares = [p for ps in self.spares.values() for p, _ in ps]
        return [p.pid for p in [*spares, *(s.popen for s in self.servers.values())]
                if p.poll() is None]

    def close(self) -> None:
        """End every spare and server (the tasks are the launcher's to end, before)."""
        with self._lock:
            self._closed = True
            spares = [p for ps in self.spares.values() for p, _ in ps]
            self.spares = {}
        for server in self.servers.values():
            server.closed.set()
        end_transports([*spares, *(s.popen for s in self.servers.values())])
        for popen in spares:  # (a server's is read to its end by its own thread)
            if popen.stderr is not None:
                popen.stderr.close()


def _send_line(popen: subprocess.Popen[bytes], line: str) -> None:
    try:
        assert popen.stdin is not None
        popen.stdin.write(line.encode() + b"\n")
        popen.stdin.flush()
    except (OSError, ValueError):
        pass  # (it ended, or was closed: take() passes it by)


def _close_spare(popen: subprocess.Popen[bytes]) -> None:
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
