"""Tasks on other machines: the agent-based launchers for SSH hosts and Slurm nodes.

Both start the same small agent (``_agent.py``, sent as ``python -c``) through a
transport that carries standard input and output: ``ssh HOST`` or ``srun -w
NODE``.  The agent starts the task under the worker bootstrap, in a process
group of its own, and takes commands on its standard input (signal, dump
stacks, end).  Its standard input is a pipe that only this process writes:
when the kernel dies (even by SIGKILL) or the connection drops, the agent
reads end of file and kills the task's whole group.  The task's output
streams through the transport into the log file on the kernel's side.

A launcher also *probes* its hosts before a cluster is defined: one short
run of the same interpreter on each host that checks the interpreter and the
working directory, and returns free ports there and the address the host
is reached at.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, ClassVar, TypedDict

import psutil

from .. import exitrecord, proctree, settings
from ..cluster import Task
from ..ending import end
from ..errors import InfrastructureError, UsageError
from ..gpus import visible_gpus
from ..proctree import Escalation, describe_exit
from ..taskside import wire
from .base import BOOTSTRAP, Launcher, LaunchSpec, Placement, Process, open_log
from .options import BackendOptions, option, seconds, text
from .warmhosts import Spare, WarmHosts, close_spare, pump

_TASKSIDE = Path(__file__).parents[1] / "taskside"
# What ``python -c`` runs on a host: the protocol's declarations (taskside/wire.py) as the module
# ``wire``, its warm starts (taskside/agentwarm.py) as ``agentwarm``, then the agent
# (taskside/_agent.py), which finds both among its globals.
AGENT_FILES = ("_agent.py", "agentwarm.py")
AGENT_CODE = (
    "import sys, types\n"
    "wire = sys.modules['mwhelpers_wire'] = types.ModuleType('mwhelpers_wire')\n"
    f"exec(compile({(_TASKSIDE / 'wire.py').read_text()!r}, 'wire.py', 'exec'), wire.__dict__)\n"
    "agentwarm = sys.modules['mwhelpers_agentwarm'] = types.ModuleType('mwhelpers_agentwarm')\n"
    "agentwarm.wire = wire\n"
    f"exec(compile({(_TASKSIDE / 'agentwarm.py').read_text()!r}, 'agentwarm.py', 'exec'), "
    "agentwarm.__dict__)\n"
    f"exec(compile({(_TASKSIDE / '_agent.py').read_text()!r}, '_agent.py', 'exec'), "
    "{'__name__': '__main__', 'wire': wire, 'agentwarm': agentwarm})\n")
# What a task's start-up loads beside it, sent with it to every host: the whole worker-side
# folder, but for the agent itself and a Kubernetes pod's start-up.
BOOTSTRAP_FILES = tuple(sorted(p.name for p in Path(BOOTSTRAP).parent.glob("*.py")
                              if p.name not in ("_bootstrap.py", *AGENT_FILES, "_podstart.py")))
# A probe whose SSH connection sshd dropped before its greeting is tried this many times.
PROBE_TRIES = 3
SSH_DROPPED = ("kex_exchange_identification", "Connection reset by peer",
               "Connection closed by remote host")
# How an agent ends its task by itself, when the kernel or the connection is gone (end of its
# input, silence past the heartbeat): sent to it in its header.
LOST_ESCALATION = proctree.ESCALATIONS["now"]


def steps(escalation: Escalation) -> str:
    """``escalation`` as the agent reads it: ``SIGNAL:SECONDS,...`` (``9:3``)."""
    return wire.steps_text(escalation)


def heartbeat_seconds(environ: Mapping[str, str] | None = None) -> float:
    """The heartbeat limit from ``$MWHELPERS_HEARTBEAT`` (default 10 s; 0: off)."""
    return settings.HEARTBEAT.read(environ)


FORWARD_PREFIXES = ("TF_", "KERAS_", "JAX_", "PYTHON", "CUDA_", "OMP_", "MKL_", "XLA_", "MWHELPERS_")
# Not these: this machine's paths and mwhelpers' own bookkeeping (the session mark
# finds escaped orphans on this machine only).
FORWARD_NEVER = ("PYTHONHOME", "PYTHONEXECUTABLE", wire.Env.GUARD_FD, settings.SSH.name,
                 wire.Env.SESSION, settings.LOG_DIR.name)

# Run on each host before the cluster is defined (argv: cwd, count, low, high); it lists the
# host's GPUs with the same function as this machine (its source goes with the probe).
PROBE_CODE = inspect.getsource(visible_gpus) + r"""
import json, os, random, socket, sys
cwd, count, low, high = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ports = []
cands = list(range(low, high + 1)); random.shuffle(cands)
for p in cands:
    if len(ports) == count: break
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try: s.bind(("", p))
        except OSError: continue
    ports.append(p)
conn = os.environ.get("SSH_CONNECTION", "").split()
print(json.dumps({"hostname": socket.gethostname(), "ports": ports, "cwd_ok": os.path.isdir(cwd),
                  "address": conn[2] if len(conn) == 4 else None, "python": sys.version.split()[0],
                  "node": os.environ.get("SLURMD_NODENAME"), "gpus": visible_gpus()}))
"""


def task_files() -> dict[str, str]:
    """What a task's start-up loads, by name: sent to its host in its agent's header."""
    files = {"_bootstrap.py": Path(BOOTSTRAP).read_text()}
    files.update((name, Path(BOOTSTRAP).with_name(name).read_text()) for name in BOOTSTRAP_FILES)
    return files


class _ProbeFields(TypedDict):
    hostname: str
    ports: list[int]  # free on the host, as many as asked for (or fewer)
    cwd_ok: bool  # the tasks' working folder exists there
    python: str  # its version
    node: str | None  # $SLURMD_NODENAME
    gpus: list[str]  # gpus.visible_gpus() there


class Probe(_ProbeFields):
    """What :data:`PROBE_CODE` prints (one JSON line) about a host."""

    address: str | None  # sshd's side of the connection, when reached over ssh


class HostInfo(_ProbeFields):
    """What the launcher knows of a probed host: the probe, with the address the other hosts
    reach it at (:meth:`AgentLauncher.address_of`)."""

    address: str


def transport_env() -> dict[str, str]:
    """The environment of ssh or srun: the kernel's, without mwhelpers' own marks
    (srun passes its environment on to the agent)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MWHELPERS_")
            or k == settings.SSH.name}


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` that a task on another host should get."""
    return {k: v for k, v in environ.items()
            if k.startswith(FORWARD_PREFIXES) and k not in FORWARD_NEVER}


class AgentProcess(Process):
    """A task on another machine, seen through the transport process running its agent
    (started with its standard input and error as pipes)."""

    def __init__(self, popen: subprocess.Popen[bytes], host: str, log_path: str | os.PathLike[str],
                 heartbeat: float | None = None, pump: threading.Thread | None = None) -> None:
        """``pump``: the thread that copies the task's output into its log, where the
        transport's output is not the log file itself (a spare's)."""
        super().__init__(popen.pid)
        self._pump = pump
        if popen.stdin is None or popen.stderr is None:
            raise ValueError("the transport's standard input and error must be pipes")
        self.popen = popen
        self._stdin: IO[bytes] = popen.stdin  # commands to the agent
        self._stderr: IO[bytes] = popen.stderr  # the agent's reports
        self.host = host
        self.remote_pid: int | None = None
        self._reported_exit: int | None = None
        self._log_path = Path(log_path)
        self._send_lock = threading.Lock()
        self._heard: float | None = None  # time.monotonic() of the agent's last report
        self._reader = threading.Thread(target=self._read_reports, daemon=True,
                                        name=f"mwhelpers-agent-{popen.pid}")
        self._reader.start()
        self._start_waiter(self._wait_transport)
        if heartbeat:
            threading.Thread(target=self._keep_alive, args=(heartbeat,), daemon=True,
                             name=f"mwhelpers-heartbeat-{popen.pid}").start()

    # -- the heartbeat ------------------------------------------------------------------
    def _keep_alive(self, limit: float) -> None:
        """Ping the agent a few times per ``limit`` seconds; once it has been silent for
        ``limit`` seconds (after its first report: connecting is ssh's or srun's business),
        count the task as lost and end the transport.  The agent, hearing no ping, ends the
        task on its host by itself."""
        while not self._exited.wait(min(2.0, limit / 4)):
            self._command(wire.command(wire.Command.PING))
            heard = self._heard
            if heard is not None and time.monotonic() - heard > limit:
                self.lost = (f"lost: {self.host} stopped answering for {limit:g} s; "
                             "its agent ends the task there by itself")
                self._mark_in_log(self.lost)
                self._cut()
                return

    def _cut(self) -> None:
        """End the transport (ssh, srun: its whole process group) here, at once; the agent
        on the other side then ends the task by itself (end of its input, or silence)."""
        end(local=proctree.group(self.popen.pid, self.running))

    def _mark_in_log(self, text: str) -> None:
        with open(self._log_path, "a") as f:
            f.write(f"[mwhelpers] {text}\n")

    # -- reports from the agent ---------------------------------------------------
    def _read_reports(self) -> None:
        for raw in self._stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            report = wire.parse_report(line)
            if report is not None:
                self._heard = time.monotonic()
                kind, rest = report
                try:
                    if kind is wire.Report.STARTED:
                        self.remote_pid = int(rest.split()[0])
                    elif kind is wire.Report.ENDED:
                        self.ended_by = rest.split()[0]
                    elif kind is wire.Report.EXIT:
                        self._reported_exit = int(rest.split()[0])
                    elif kind is wire.Report.RECORD:
                        self._keep_record(rest)
                    elif kind is wire.Report.BAD_HEADER:
                        self._mark_in_log(f"the agent on {self.host} refused its header: {rest}")
                    elif kind is wire.Report.COLD:
                        self._mark_in_log(f"started afresh on {self.host}, not forked from its "
                                          f"warm server: {rest}")
                except (ValueError, IndexError):
                    self._mark_in_log(f"a report of the agent on {self.host} not understood: "
                                      f"{line!r}")
            elif line.strip():
                with open(self._log_path, "a") as f:  # ssh's or srun's own words
                    f.write(f"[{self.host}] {line}\n")

    def _keep_record(self, text: str) -> None:
        """The task's exit record, written on its host and sent by its agent: put beside its
        log here (written beside, renamed into place), where every task's is read."""
        path = exitrecord.path_for(self._log_path)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            partial.write_text(text)
            os.replace(partial, path)
        except OSError:
            pass

    def _wait_transport(self) -> int:
        code = self.popen.wait()
        self._reader.join(10 if self.lost is None else 0.5)
        if self._pump is not None:  # the task's last lines in its log before its end is known
            self._pump.join(10 if self.lost is None else 0.5)
        self._close_stdin()
        if self._reported_exit is not None:
            return self._reported_exit
        return code if code != 0 else 255  # the transport ended without the task's status

    # -- commands to the agent ------------------------------------------------------
    def _release(self) -> None:
        self._command(wire.command(wire.Command.RELEASE))

    def _command(self, line: str) -> bool:
        """Send one line (a command, or the header first) to the agent."""
        with self._send_lock:
            try:
                self._stdin.write((line + "\n").encode())
                self._stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def _close_stdin(self) -> None:
        with self._send_lock:
            try:
                self._stdin.close()
            except OSError:
                pass

    def processes(self) -> list[psutil.Process]:
        return []  # they live on another machine: commands go through the agent

    def send(self, sig: int) -> list[psutil.Process]:
        self._command(wire.command(wire.Command.SIGNAL, int(sig)))
        return []

    def dump_stacks(self) -> None:
        self._command(wire.command(wire.Command.DUMP))

    def dump_stacks_by_signal(self) -> None:
        self._command(wire.command(wire.Command.DUMP_BY_SIGNAL))

    def request_end(self, escalation: Escalation) -> None:
        """Ask the agent to escalate through ``escalation``; returns at once."""
        if not self._command(wire.command(wire.Command.END, steps(escalation))):
            self._close_stdin()

    def disconnect(self) -> None:
        """Close the lifeline: the agent kills the task."""
        self._close_stdin()

    def end(self, escalation: Escalation = proctree.DEFAULT_ESCALATION, who: str = "") -> list[str]:
        """The agent escalates on its host; when it does not answer, the lifeline is
        closed and the transport killed, and the agent ends the task when it notices (end
        of input, or the heartbeat)."""
        if not self.running:
            return []
        name = who or self.describe()
        self.request_end(escalation)
        self.wait(sum(t for _, t in escalation) + 5)
        if self.running:
            self.disconnect()
            self.wait(3)
        if self.running:
            self._cut()
            self.wait(2)
            return [f"could NOT end {name} ({self.describe()}): its agent did not answer; its "
                    "connection was cut, and the agent ends the task when it notices"]
        how = self.ended_by or describe_exit(self.returncode)
        return [f"ended {name}: {self.describe()} with {how}"]

    @property
    def label(self) -> str:
        pid = self.remote_pid if self.remote_pid is not None else "?"
        return f"{pid}@{self.host}"

    def describe(self) -> str:
        pid = self.remote_pid if self.remote_pid is not None else "?"
        return f"pid {pid} on {self.host}"


def host_list(hosts: str | Sequence[str] | None, what: str = "hosts") -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` -> ``["a", "b"]``, refusing empty names."""
    if isinstance(hosts, str):
        hosts = hosts.split(",")
    names = [str(h).strip() for h in (hosts or [])]
    if not names or not all(names):
        raise UsageError(f"{what} must name the machines to run on (a list, or H1,H2), "
                         f"got {names!r}")
    return names


def heartbeat_option(value: object) -> float:
    """Seconds of silence, 1 or more, or 0 (off)."""
    number = seconds(value)
    if 0 < number < 1:
        raise ValueError("1 s or more, or 0 to turn it off")
    return number


def hosts_option(value: object) -> tuple[str, ...]:
    """Host names, ``"a,b"`` or a list; not empty."""
    return tuple(host_list(value))  # type: ignore[arg-type]  # TypeError says why


@dataclass(frozen=True)
class _Hosts(BackendOptions):
    hosts: tuple[str, ...] | None = option(hosts_option, "the machines to run on, a list or "
                                           "H1,H2", metavar="H1,H2")


@dataclass(frozen=True)
class RemoteOptions(BackendOptions):
    """What every agent backend takes about the Python on its hosts: ``python``, ``cwd``,
    ``heartbeat``.  A backend that finds its hosts by itself (slurm) subclasses this."""

    python: str | None = option(text, "the tasks' interpreter there (default: the kernel's)",
                                metavar="PATH")
    cwd: str | None = option(text, "the folder tasks start in there (default: the kernel's)",
                             metavar="DIR")
    heartbeat: float | None = option(
        heartbeat_option, "seconds of silence after which a task counts as lost and is ended "
        "(default: $MWHELPERS_HEARTBEAT or 10; 0: never)", metavar="SECONDS")


@dataclass(frozen=True)
class AgentOptions(RemoteOptions, _Hosts):
    """The options of an agent backend that is given its hosts: ``hosts`` (first: the bases
    give their fields in reverse order), then :class:`RemoteOptions`'.  A backend whose hosts
    are other things redeclares ``hosts`` with its own help."""


class AgentLauncher(Launcher):
    """Runs tasks through an agent on hosts reached by a transport command.

    A subclass gives :meth:`transport`, :meth:`address_of` and :meth:`explain`
    (and ``name``, as every backend): it is a whole backend, taking
    :class:`AgentOptions` (``hosts``, ``python``, ``cwd``, ``heartbeat``), or options of its
    own that subclass them (or :class:`RemoteOptions`, giving the hosts to this constructor).
    """

    remote = True
    standby = True
    # Whether a host's warm server may fork its tasks (mwhelpers.backends.warmhosts): not where
    # each task must live in a unit of its own that the backend accounts for (a Slurm step):
    # there each spare starts a warm server of its own.
    warm_servers: ClassVar[bool] = True
    options: ClassVar[type[RemoteOptions]] = AgentOptions
    cwd: str  # the folder tasks start in on every host (default: the kernel's)

    def __init__(self, options: RemoteOptions, hosts: Sequence[str] | None = None) -> None:
        """``hosts``: where the tasks run (None: ``options.hosts``)."""
        self.python = options.python or sys.executable
        self.cwd = options.cwd or os.getcwd()
        if hosts is None and isinstance(options, _Hosts):
            hosts = options.hosts
        self.hosts = host_list(hosts)
        # seconds of silence before a task counts as lost, both ways (0: never)
        self.heartbeat = heartbeat_seconds() if options.heartbeat is None else options.heartbeat
        self.started: list[AgentProcess] = []
        self.closed = False
        self.host_info: dict[str, HostInfo] = {}  # {host: what its probe found}, by place()
        # warm servers and spares (mwhelpers.backends.warmhosts), started by prepare()
        self.warm = (WarmHosts(self, AGENT_CODE, task_files, transport_env)
                     if self.standby and WarmHosts.enabled() else None)

    # -- what subclasses give -------------------------------------------------------
    def transport(self, host: str, argv: list[str]) -> list[str]:
        """The local command that runs ``argv`` on ``host``."""
        raise NotImplementedError

    def address_of(self, host: str, probe: Probe) -> str:
        """The address other hosts reach ``host`` at."""
        raise NotImplementedError

    def explain(self, host: str, code: int, err: str) -> InfrastructureError:
        """The error (an :class:`InfrastructureError`) for a failed probe of ``host``."""
        raise NotImplementedError

    def transient(self, code: int, err: str) -> bool:
        """Whether a probe that failed this way is worth trying again at once."""
        return False

    # -- probing ----------------------------------------------------------------------
    def probe(self, host: str, count: int, port_range: tuple[int, int],
              timeout: float = 60) -> HostInfo:
        low, high = port_range
        argv = [self.python, "-c", PROBE_CODE, self.cwd, str(count), str(low), str(high)]
        for attempt in range(1, PROBE_TRIES + 1):
            try:
                done = subprocess.run(self.transport(host, argv), stdin=subprocess.DEVNULL,
                                      capture_output=True, timeout=timeout, env=transport_env())
            except FileNotFoundError as e:
                raise InfrastructureError(f"{e.filename} is not installed on this machine") from None
            except subprocess.TimeoutExpired:
                raise InfrastructureError(f"{host} did not answer within {timeout} s; check that "
                                          f"{self.describe_reach(host)} works from this machine") from None
            out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
            if attempt == PROBE_TRIES or not self.transient(done.returncode, err):
                break
            time.sleep(0.5 * attempt)
        info: Probe | None = None
        for line in out.splitlines():
            if line.startswith("{"):
                info = json.loads(line)
        if done.returncode != 0 or info is None:
            raise self.explain(host, done.returncode, (err + out).strip())
        if not info["cwd_ok"]:
            raise InfrastructureError(
                f"the working directory {self.cwd} does not exist on {host}; tasks start there. "
                "Use a folder every host has (a shared home), or give the cluster one (cwd=...)")
        if len(info["ports"]) < count:
            raise InfrastructureError(f"{host} has fewer than {count} free ports in {low}-{high}; "
                             "set MWHELPERS_PORT_RANGE to another range")
        return {**info, "address": self.address_of(host, info)}

    def probe_all(self, hosts: Sequence[str], counts: Mapping[str, int],
                  port_range: tuple[int, int]) -> dict[str, HostInfo]:
        """Probe every host at once; {host: info}."""
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            futures = {h: pool.submit(self.probe, h, counts[h], port_range) for h in hosts}
            return {h: f.result() for h, f in futures.items()}

    def place(self, tasks: Sequence[Task], port_range: tuple[int, int]) -> dict[Task, Placement]:
        """``{task: Placement}``: task i on host i mod len(hosts), each with a port free on
        its host and used by no other task of the cluster (so tasks cannot collide even
        where two hosts share an address)."""
        hosts = self.hosts
        place = {t: hosts[i % len(hosts)] for i, t in enumerate(tasks)}
        wanted = {h: 2 * len(tasks) for h in dict.fromkeys(place.values())}
        info = self.probe_all(list(wanted), wanted, port_range)
        self.host_info = info  # what each probe found (its GPUs among it)
        used: set[int] = set()
        placement: dict[Task, Placement] = {}
        for t in tasks:
            h = place[t]
            port = next(p for p in info[h]["ports"] if p not in used)
            used.add(port)
            placement[t] = Placement(h, info[h]["address"], port)
        return placement

    def task_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        # Another machine gets the variables that matter, not this one's whole environment.
        return forwarded_env(environ)

    def host_gpus(self) -> dict[str | None, list[str]]:
        gpus: dict[str | None, list[str]] = {h: info.get("gpus", []) for h, info in self.host_info.items()}
        return gpus

    def describe_reach(self, host: str) -> str:
        return f"reaching {host}"

    def machine_of(self, host: str) -> str:
        """What tells one machine from another among the hosts (its tasks share one warm
        server): the host's own name here; a backend whose hosts can share a machine (Ray's
        bundles) says so."""
        return host

    # -- starting ---------------------------------------------------------------------
    def start(self, spec: LaunchSpec) -> AgentProcess:
        if self.closed:
            raise RuntimeError("this launcher was closed; define the cluster again")
        host = spec.host
        if host is None:
            raise ValueError(f"{self.name or type(self).__name__} starts tasks on other hosts: "
                             "the launch spec names none")
        spare = self.warm.take(host, standby=spec.standby) if self.warm else None
        try:
            header = self._header(spec, spare)
            logf = open_log(spec.log_path)
        except BaseException:
            if spare is not None:
                close_spare(spare.popen)
            raise
        copier = None
        if spare is not None:  # its output goes to the log through this machine
            popen = spare.popen
            assert popen.stdout is not None
            copier = threading.Thread(target=pump, args=(popen.stdout, logf), daemon=True,
                                      name=f"mwhelpers-log-{popen.pid}")
            copier.start()
        else:
            try:
                popen = subprocess.Popen(
                    self.transport(host, [self.python, "-c", AGENT_CODE]),
                    stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.PIPE,
                    start_new_session=True, env=transport_env())
            finally:
                os.close(logf)
        proc = AgentProcess(popen, host, spec.log_path, heartbeat=self.heartbeat, pump=copier)
        proc._command(header)
        self.started = [p for p in self.started if p.running] + [proc]
        return proc

    def prepare(self, envs: Mapping[str | None, list[dict[str, str]]]) -> None:
        if self.warm is not None:
            self.warm.prepare({h: e for h, e in envs.items() if h is not None})

    def _header(self, spec: LaunchSpec, spare: Spare | None) -> str:
        """The agent's header for ``spec`` (for ``spare``'s agent, which has the start-up's
        files and may have a warm server of its own)."""
        files = {} if spare else task_files()
        script = spec.script
        if spec.cell:
            files["cell.py"] = Path(spec.script).read_text()
            script = "{dir}/cell.py"
        argv = [self.python, "-u", "{dir}/_bootstrap.py", *(["--standby"] if spec.standby else []),
                *(["--cell"] if spec.cell else []), script, *spec.args]
        spec.cwd = spec.cwd or self.cwd
        return wire.header(
            argv=argv, env=spec.env, cwd=spec.cwd, files=files, port=spec.port,
            heartbeat=self.heartbeat or None, script=None if spec.cell else script,
            standby=spec.standby, escalation=steps(LOST_ESCALATION),
            exit_record=wire.Env.EXIT_RECORD if wire.Env.EXIT_RECORD in spec.env else None,
            warm=self.warm.warm_name(spec, spare) if self.warm else None)

    def close(self) -> None:
        """End what still runs (SIGKILL through each agent), then the warm servers and spares."""
        self.closed = True
        super().close()
        if self.warm is not None:
            self.warm.close()
