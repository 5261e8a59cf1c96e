"""A real Ray cluster of three nodes for the tests: the head on this machine, bound to the test
hosts' bridge address (so that a driver here is on a node of the cluster, as a notebook on the
head is), with no CPUs of its own, and one worker node in each test host's namespace.

Token authentication is on (``RAY_AUTH_MODE=token``, a token of the cluster's own in its
folder): what the guide asks of every Ray cluster; :meth:`RayCluster.client_env` is what a
driver (the kernel) needs to connect.

Every node is one ``ray start --block`` process in a session of its own, with its own short
temporary folder (Ray's socket paths must stay under 108 bytes); :meth:`RayCluster.down` ends
each session's whole process group by its id (SIGKILL: Ray's processes outlive a SIGTERM to
``ray start``), then removes the folders.  Nothing else on the machine is touched: never
``ray stop``, which ends every Ray process of the machine.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mwhelpers.backends.raynodes import RAY_STARTED, STARTUP_TIMED_OUT

RAY = str(Path(sys.executable).with_name("ray"))
COMMON = ["--disable-usage-stats", "--include-log-monitor=false", "--block"]


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class RayCluster:
    def __init__(self, hosts: object, cpus_per_node: int = 2) -> None:
        self.hosts = hosts
        self.cpus = cpus_per_node
        self.dir = Path(tempfile.mkdtemp(prefix="mwr", dir="/tmp"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.address = ""
        self.token = self.dir / "token"
        self.token.write_text(secrets.token_hex(32) + "\n")
        self.token.chmod(0o600)

    def client_env(self) -> dict[str, str]:
        """What a driver of this cluster needs in its environment: the token's mode and file."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token)}

    def env(self) -> dict[str, str]:
        # Ray's own processes: no mwhelpers marks (a runtime would count them as its leftovers)
        out = {k: v for k, v in os.environ.items()
               if not k.startswith(("MWHELPERS_", "RAY_"))}
        out["RAY_USAGE_STATS_ENABLED"] = "0"
        out["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # SIGTERM ends a node at once
        out.update(self.client_env())
        return out

    def _start(self, name: str, argv: list[str], netns: str | None = None) -> None:
        folder = self.dir / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        prefix = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
        with open(self.dir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [*prefix, RAY, "start", *argv, f"--temp-dir={folder}", *COMMON],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=self.env())

    def up(self) -> RayCluster:
        gateway = self.hosts.gateway  # type: ignore[attr-defined]
        port = free_port(gateway)
        self.address = f"{gateway}:{port}"
        # Only what the tests use, so that three nodes start well inside Ray's fixed 30 s wait
        # for a raylet on a busy 2-core machine: no dashboard, no autoscaler monitor, no log
        # monitor on any node (the relay streams a task's output itself).  The Ray Client
        # server stays (``ray start`` accepts no port that turns it off).
        client = free_port(gateway)
        while client == port:
            client = free_port(gateway)
        # A head on a slow, loaded 2-core machine: over 60 s, and Ray's 30 s missed twice running.
        self._bring_up("head", ["--head", f"--node-ip-address={gateway}", f"--port={port}",
                                "--num-cpus=0", f"--ray-client-server-port={client}",
                                "--include-dashboard=false", "--no-monitor"])
        # One node after the other: a raylet registers only once its node's Python agents have
        # started (7 s idle here), and two nodes starting at once missed Ray's 30 s twice each
        # on CI beside a notebook.
        for name in self.hosts.names:  # type: ignore[attr-defined]
            addr = self.hosts.addresses[name]  # type: ignore[attr-defined]
            self._bring_up(name, [f"--address={self.address}", f"--node-ip-address={addr}",
                                  f"--num-cpus={self.cpus}"], netns=name)
        return self

    def _bring_up(self, name: str, argv: list[str], netns: str | None = None,
                  timeout: float = 180, retries: int = 2) -> None:
        """Start node ``name`` and wait until its ``ray start`` has said "Ray runtime started.",
        which it says once its raylet has registered with the GCS
        (``ray._private.node.Node.__init__``).

        A raylet that missed that fixed 30 s window (Ray's "timed out during startup", seen on
        a loaded 2-core CI machine) is started again, ``retries`` times, after its process group
        has been ended."""
        self._start(name, argv, netns)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = (self.dir / f"{name}.log").read_text(errors="replace")
            if RAY_STARTED in log:
                return
            if self.procs[name].poll() is not None:
                if STARTUP_TIMED_OUT not in log or retries == 0:
                    raise RuntimeError(f"ray start of {name} ended "
                                       f"({self.procs[name].returncode}):\n" + self.log_tails())
                retries -= 1
                self._end(name)
                (self.dir / f"{name}.log").rename(self.dir / f"{name}.failed.log")
                self._start(name, argv, netns)
            time.sleep(0.2)
        raise RuntimeError(f"ray start of {name} did not finish in {timeout} s:\n"
                           + self.log_tails())

    def log_tails(self, lines: int = 20) -> str:
        """The end of each ``ray start``'s output and of each node's raylet log (where a raylet
        says what it waited for)."""
        out = []
        logs = [*sorted(self.dir.glob("*.log")),
                *sorted(self.dir.glob("*/session_latest/logs/raylet.out"))]
        for log in logs:
            text = [ln for ln in log.read_text(errors="replace").splitlines()
                    if "[state-dump]" not in ln][-lines:]  # the raylet's periodic dumps
            out.append(f"--- {log.relative_to(self.dir)} ---\n" + "\n".join(text))
        return "\n".join(out)

    def _end(self, name: str) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait(10)

    def down(self) -> None:
        """SIGTERM to each node's ``ray start --block`` (it ends its node's processes, workers
        too), SIGKILL to its process group after 10 s; the nodes' folders go."""
        for proc in self.procs.values():
            proc.terminate()
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self._end(name)
        shutil.rmtree(self.dir, ignore_errors=True)
