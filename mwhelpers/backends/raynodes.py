"""The ``ray`` backend: each task on a node of a Ray cluster, through the same agent as over SSH.

``%cluster 2 --backend ray --address HEAD:6379`` (``define_cluster(2, backend="ray",
address=...)``; ``$RAY_ADDRESS`` when not given) asks Ray for a placement group of one bundle
per task (``cpus`` and ``gpus`` each; ``placement``: ``spread`` over nodes where it can, or
``pack``, ``strict-spread``, ``strict-pack``), held for as long as the cluster is defined.  Each
task then runs on its bundle's node as a real process, started by mwhelpers' agent, which the
bundle's actor starts and relays (``_rayrelay.py``: the cluster's one Ray driver, which holds the
group, and a small client beside the kernel per command, as ``ssh`` is over SSH): live logs,
signals, stack dumps, the exit record, the heartbeat and standbys work as over SSH, and
TF_CONFIG names the node's address and a port free there.  A bundle's GPUs are Ray's
own: the actor asks for them and Ray sets ``CUDA_VISIBLE_DEVICES``, which the task inherits.

When the cluster is closed, or the kernel dies, the group goes and Ray ends every actor in it;
each agent, its input ended, ends its task's whole process group.  Ray must be installed where
the kernel runs (the driver: a node of the cluster) and on the nodes; mwhelpers need not be on
the nodes, but the program and the working folder must be at the same path on each.

Ray's services run code for whoever reaches them unless its token authentication is on
(Ray 2.52 and later: ``RAY_AUTH_MODE=token``, the token in ``RAY_AUTH_TOKEN_PATH``).  A
cluster reached without a token is said to take anyone's code, once, as it is defined.
``address="local"`` starts a private Ray head on this machine for the cluster, ended with
it or with the kernel: every service on loopback, no dashboard, and token authentication with
a token of its own (a file only this user reads); see :class:`PrivateHead`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..cluster import Task
from ..ending import end
from ..errors import InfrastructureError, UsageError
from ..ports import reserve_ports
from ..proctree import Policy, alive, group
from ..taskside import wire
from .agent import AgentLauncher, Probe, RemoteOptions
from .base import Placement
from .options import BackendOptions, option, quantity, seconds, text

RELAY = Path(__file__).with_name("_rayrelay.py")
# Run as python -c: the relay's folder is not put first on sys.path (its modules' names would
# hide others'), and Ray sends the actor's class from __main__ by value.
RELAY_CODE = (f"exec(compile({RELAY.read_text()!r}, {str(RELAY)!r}, 'exec'), "
              "{'__name__': '__main__'})\n")
PLACEMENTS = {"spread": "SPREAD", "pack": "PACK", "strict-spread": "STRICT_SPREAD",
              "strict-pack": "STRICT_PACK"}
NAMESPACE = "mwhelpers"  # the Ray namespace of the placement groups mwhelpers makes


def placement(value: object) -> str:
    """spread, pack, strict-spread or strict-pack."""
    word = str(value).strip().lower().replace("_", "-")
    if word not in PLACEMENTS:
        raise ValueError(f"one of {', '.join(PLACEMENTS)}")
    return word


@dataclass(frozen=True)
class _Ray(BackendOptions):
    address: str | None = option(text, "the Ray cluster's address, HOST:PORT of its head "
                                 "(default: $RAY_ADDRESS), or local: a private head here",
                                 metavar="HOST:PORT")
    placement: str = option(placement, "where the tasks go: spread (a node each where it can), "
                            "pack, strict-spread or strict-pack", default="spread",
                            metavar="HOW")
    cpus: float = option(quantity, "CPUs each task's bundle holds (default 1)", default=1.0,
                         metavar="N")
    gpus: float = option(quantity, "GPUs each task's bundle holds; Ray sets CUDA_VISIBLE_DEVICES "
                         "(default 0)", default=0.0, metavar="N")
    place_timeout: float = option(seconds, "seconds Ray is given to place every task's bundle "
                                  "(default 60)", default=60.0, metavar="SECONDS")


@dataclass(frozen=True)
class RayOptions(RemoteOptions, _Ray):
    """The ray backend's options: where the cluster is and what each task holds there, then the
    agent's (``python``: default, the Python that runs Ray on each node)."""


# The private head's lifeline: runs ``ray start --block`` (its arguments) with SIGTERM as its
# parent-death signal, and reads its own input until it ends.  The kernel holds that input: when
# the kernel closes it, or dies, this process leaves, and ray start ends the head (every service
# and worker it started).  Its only thread starts ray start, so the signal follows this process.
# argv: the folder to remove once the command has ended, then the command.  Its input's end
# (the kernel closed it, or died) ends the command: SIGTERM, then SIGKILL after 15 s.
LIFELINE = ("import ctypes, shutil, signal, subprocess, sys\n"
            "def die_with_me():\n"
            "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
            "child = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, "
            "preexec_fn=die_with_me)\n"
            "while sys.stdin.buffer.read(65536):\n"
            "    pass\n"
            "child.terminate()\n"
            "try:\n"
            "    child.wait(15)\n"
            "except subprocess.TimeoutExpired:\n"
            "    child.kill()\n"
            "    child.wait()\n"
            "shutil.rmtree(sys.argv[1], ignore_errors=True)\n")


# Seconds a private head may take to start: on a slow 2-core machine busy with other work,
# one had not started after 60 s (2026-11-30).
HEAD_START_TIMEOUT = 180.0
# What ``ray start`` says once its raylet has registered with the GCS, and when its raylet
# missed the fixed 30 s that Ray gives it for that (``ray/_private/node.py``; the head is then
# started once more).
RAY_STARTED = "Ray runtime started."
STARTUP_TIMED_OUT = "timed out during startup"


class PrivateHead:
    """A Ray head on this machine for one cluster (``address="local"``): every service on
    loopback (``--node-ip-address=127.0.0.1``, kept by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    without which Ray puts the machine's address in its place), no dashboard, token
    authentication with a token of its own, none of the kernel's ``RAY_*`` settings.  It ends
    when :meth:`close` or the kernel's death ends its lifeline (:data:`LIFELINE`), which then
    removes its folder."""

    def __init__(self, cpus: int | None = None) -> None:
        for attempt in (1, 2):
            self._start(cpus)
            why = self._wait_ready(HEAD_START_TIMEOUT)
            if why is None:
                return
            said = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            self.close()
            if attempt == 1 and any(STARTUP_TIMED_OUT in line for line in said):
                continue  # Ray's fixed window for its raylet, missed once on a loaded machine
            raise InfrastructureError(f"a private Ray head could not be started here: {why}; "
                                      "its log's last lines: " + " / ".join(said))

    def _start(self, cpus: int | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="mwray"))  # short: Ray's socket paths are
        token = self.dir / "token"
        token.write_text(secrets.token_hex(32) + "\n")
        token.chmod(0o600)
        # What the head and every driver of it need: loopback, and the token.
        self.env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        # Its own ports, held among mwhelpers' processes (Ray's 10001 and 52365 are shared)
        self._ports = reserve_ports(3)
        port, client, agent = (r.port for r in self._ports)
        self.address = f"127.0.0.1:{port}"
        ray = str(Path(sys.executable).with_name("ray"))
        self.log = self.dir / "head.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LIFELINE, str(self.dir),
                 ray if os.path.exists(ray) else "ray", "start",
                 "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                 f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
                 "--include-dashboard=false", "--disable-usage-stats",
                 # one fixed node: no autoscaler; the relay streams the tasks' output itself
                 "--no-monitor", "--include-log-monitor=false",
                 f"--temp-dir={self.dir / 'ray'}", "--block",
                 *([f"--num-cpus={cpus}"] if cpus else [])],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env={**without_ray_settings(os.environ), **self.env})

    def _wait_ready(self, timeout: float) -> str | None:
        """None once the head has started; otherwise why it has not."""
        deadline = time.monotonic() + timeout
        while RAY_STARTED not in self.log.read_text(errors="replace"):
            code = self.proc.poll()
            if code is not None:
                return f"its lifeline ended (exit code {code})"
            if self._ray_start_ended():
                return "`ray start` ended"
            if time.monotonic() > deadline:
                return f"`ray start` had not started it after {timeout:g} s"
            time.sleep(0.2)
        return None

    def _ray_start_ended(self) -> bool:
        """Whether ``ray start`` has ended (the lifeline reaps it only at its own end)."""
        try:
            started = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return False
        return bool(started) and not any(alive(p) for p in started)

    def close(self) -> None:
        """End the lifeline (ray start then ends the head), then whatever of its group is left."""
        members = group(self.proc.pid, self.proc.poll() is None)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        _, left = psutil.wait_procs(members, timeout=15)  # ray start ends them (about 1 s)
        end(local=left, policy=Policy.INTERRUPT)
        self.proc.wait(5)
        for held in self._ports:
            held.release()
        shutil.rmtree(self.dir, ignore_errors=True)


def without_ray_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without Ray's settings (a token of the user's would win over the head's)."""
    return {k: v for k, v in environ.items() if not k.startswith("RAY_")}


class RayLauncher(AgentLauncher):
    """Tasks on the nodes of a Ray cluster, each in a bundle of one placement group."""

    name = "ray"
    options = RayOptions

    def __init__(self, options: RayOptions = RayOptions(),
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        address = options.address or environ.get("RAY_ADDRESS", "").strip()
        if not address:
            raise UsageError("the ray backend needs the Ray cluster's address: --address HOST:PORT "
                             "(define_cluster(..., backend='ray', address='HOST:PORT')), the "
                             "head's as 'ray start --head' printed it, or $RAY_ADDRESS")
        if importlib.util.find_spec("ray") is None:
            raise InfrastructureError(f"Ray is not installed for {sys.executable}, which drives "
                                      "the cluster: pip install 'mwhelpers[ray]' (Ray 2.60 or "
                                      "later, as on the nodes)")
        super().__init__(options, ["ray"])  # the hosts: the bundles, once placed
        self.head = PrivateHead() if address == "local" else None
        self.driver_env = dict(self.head.env) if self.head else {}
        address = self.head.address if self.head else address
        if options.python is None:
            self.python = wire.THIS_PYTHON  # the Python that runs Ray on each node
        self.address = address
        self.strategy = PLACEMENTS[options.placement]
        self.cpus, self.gpus = options.cpus, options.gpus
        self.place_timeout = options.place_timeout
        # With GPUs, no standbys, warm servers or spares: when each command had an actor of its
        # own, theirs waited for the GPUs the task's actor held.  A bundle's commands now share
        # one actor, but that has not been tried on GPUs yet.
        if self.gpus:
            self.standby = False  # type: ignore[misc]
            self.warm = None  # nor warm servers or spares (mwhelpers.backends.warmhosts)
        self.group = f"mwhelpers-{uuid.uuid4().hex[:12]}"
        self.bundle_of: dict[str, int] = {}  # host label -> bundle index
        self.address_at: dict[str, str] = {}  # host label -> the node's address
        self._holder: subprocess.Popen[bytes] | None = None
        self._via: Path | None = None  # the holder's socket, in a folder of its own
        self.token_sent = True  # whether the holder connected with a token (said by it)

    # -- the placement group ------------------------------------------------------------
    def _relay(self, *words: str) -> list[str]:
        """A relay's command; for a private head, through env: the kernel's RAY_* settings
        out, the head's in."""
        settings = []
        if self.driver_env:
            settings = ["env", *(f"--unset={k}" for k in os.environ if k.startswith("RAY_")),
                        *(f"{k}={v}" for k, v in self.driver_env.items())]
        return [*settings, sys.executable, "-c", RELAY_CODE, *words, "--address", self.address,
                "--namespace", NAMESPACE, "--name", self.group]

    def _hold(self, bundles: int) -> list[str]:
        """Start the holder of the group; the address of each bundle's node."""
        # A folder of its own (0700), at a path short enough for a Unix socket's (107 bytes).
        base = tempfile.gettempdir()
        self._via = Path(tempfile.mkdtemp(prefix="mwrr", dir=base if len(base) < 80 else "/tmp"),
                         "relay")
        holder = subprocess.Popen(
            [*self._relay("hold"), "--bundles", str(bundles), "--cpus", f"{self.cpus:g}",
             "--gpus", f"{self.gpus:g}", "--strategy", self.strategy,
             "--timeout", f"{self.place_timeout:g}", "--listen", str(self._via)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        self._holder = holder
        said: dict[str, object] = {}
        last: list[str] = []  # the holder's last other lines (Ray's words)
        answered = threading.Event()

        def read() -> None:  # for the holder's whole life: a pipe nobody reads would fill
            assert holder.stdout is not None
            for raw in holder.stdout:
                if raw.startswith(b"{") and not answered.is_set():
                    said.update(json.loads(raw))
                    answered.set()
                elif raw.strip():
                    last[:] = [*last[-19:], raw.decode(errors="replace").strip()]
            answered.set()

        threading.Thread(target=read, daemon=True, name="mwhelpers-ray-holder").start()
        answered.wait(self.place_timeout + 60)
        if "nodes" not in said:
            self._release()
            why = said.get("error") or (last or ["no answer"])[-1]
            raise InfrastructureError(f"the Ray cluster at {self.address} did not place this "
                                      f"cluster's {bundles} tasks: {why}")
        nodes = said["nodes"]
        assert isinstance(nodes, list)
        self.token_sent = bool(said.get("token_sent", True))
        return [str(n) for n in nodes]

    def _release(self) -> None:
        holder, self._holder = self._holder, None
        via, self._via = self._via, None
        try:
            if holder is None:
                return
            if holder.stdin is not None:
                try:
                    holder.stdin.close()  # the holder removes the group and ends
                except OSError:
                    pass
            try:
                holder.wait(15)
            except subprocess.TimeoutExpired:
                end(local=group(holder.pid, holder.poll() is None), policy=Policy.NOW)
        finally:
            if via is not None:
                shutil.rmtree(via.parent, ignore_errors=True)

    def place(self, tasks: Sequence[Task], port_range: tuple[int, int]) -> dict[Task, Placement]:
        """A bundle per task (the group made now), then ports free on each bundle's node."""
        nodes = self._hold(len(tasks))
        seen: dict[str, int] = {}
        labels = []
        for i, node in enumerate(nodes):
            seen[node] = seen.get(node, 0) + 1
            label = node if seen[node] == 1 else f"{node}#{seen[node]}"
            labels.append(label)
            self.bundle_of[label], self.address_at[label] = i, node
        self.hosts = labels
        return super().place(tasks, port_range)

    # -- the agent's transport --------------------------------------------------------------
    def transport(self, host: str, argv: list[str]) -> list[str]:
        """A client of the holder, which runs ``argv`` through the bundle's actor (no Ray
        connection of its own)."""
        return [sys.executable, "-c", RELAY_CODE, "run", "--via", str(self._via),
                "--bundle", str(self.bundle_of[host]), "--expect", self.address_at[host],
                "--timeout", f"{self.place_timeout:g}", "--", *argv]

    def task_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        # A bundle's GPUs are Ray's to give (the actor's CUDA_VISIBLE_DEVICES), not the kernel's.
        return {k: v for k, v in super().task_env(environ).items() if k != "CUDA_VISIBLE_DEVICES"}

    def notes(self) -> list[str]:
        if self.token_sent:
            return []
        return [f"the Ray cluster at {self.address} let this kernel in without a token: it "
                "runs code for anyone who reaches its head (CVE-2023-48022). Turn on its token "
                "authentication (Ray 2.52 or later: RAY_AUTH_MODE=token and "
                "RAY_AUTH_TOKEN_PATH=FILE on every node and here), or keep its network private"]

    def describe_reach(self, host: str) -> str:
        return f"the Ray cluster at {self.address} (ray status)"

    def address_of(self, host: str, probe: Probe) -> str:
        return self.address_at[host]

    def machine_of(self, host: str) -> str:
        return self.address_at[host]  # (a node's address is its own in a Ray cluster)

    def explain(self, host: str, code: int, err: str) -> InfrastructureError:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if code == 127 or "no such file" in err.lower():
            return InfrastructureError(f"no Python at {self.python} on Ray node {host} ({last}); "
                                       "leave python unset to use the one that runs Ray there")
        return InfrastructureError(f"cannot run on Ray node {host} (exit {code}): {last}")

    def close(self) -> None:
        """End what still runs, then give the placement group back (and end a private head)."""
        super().close()
        self._release()
        if self.head is not None:
            self.head.close()
