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

RAY = str(Path(sys.executable).with_name("ray"))
COMMON = ["--disable-usage-stats", "--block"]


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
        client = free_port(gateway)
        while client == port:
            client = free_port(gateway)
        self._start("head", ["--head", f"--node-ip-address={gateway}", f"--port={port}",
                             "--num-cpus=0", f"--ray-client-server-port={client}"])
        self._wait_nodes(1, 60)
        for name in self.hosts.names:  # type: ignore[attr-defined]
            addr = self.hosts.addresses[name]  # type: ignore[attr-defined]
            self._start(name, [f"--address={self.address}", f"--node-ip-address={addr}",
                               f"--num-cpus={self.cpus}"], netns=name)
        self._wait_nodes(1 + len(self.hosts.names), 90)  # type: ignore[attr-defined]
        return self

    def _wait_nodes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"ray start of {name} ended ({proc.returncode}):\n"
                                       + self.log_tails())
            done = subprocess.run([RAY, "status", f"--address={self.address}"],
                                  capture_output=True, text=True, env=self.env(), timeout=60)
            active = done.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
            if done.returncode == 0 and active.count(" node_") >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not reach {count} nodes:\n" + self.log_tails())

    def log_tails(self, lines: int = 20) -> str:
        out = []
        for log in sorted(self.dir.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name} ---\n" + "\n".join(text))
        return "\n".join(out)

    def down(self) -> None:
        """SIGTERM to each node's ``ray start --block`` (it ends its node's processes, workers
        too), SIGKILL to its process group after 10 s; the nodes' folders go."""
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait(10)
        self.procs = {}
        shutil.rmtree(self.dir, ignore_errors=True)
