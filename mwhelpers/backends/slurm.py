"""Slurm: tasks on the nodes of an allocation, and a batch script for the same program.

Inside an allocation (a kernel started under ``salloc`` or in an ``sbatch`` job,
or any process with ``SLURM_JOB_ID`` naming a running job), :class:`SlurmLauncher`
starts each task as a one-task job step on its node, ``srun --jobid J
--nodelist NODE --overlap``, through the same agent the SSH launcher uses.  So
each task can be killed, restarted and followed on its own, as locally.

TF_CONFIG is ours, not TensorFlow's ``SlurmClusterResolver``: that one fails on
CPU-only nodes (it runs ``nvidia-smi``, tensorflow/tensorflow#56894) and gives
ports ``base + local index``, which collide when two node names share an address.
Here every task of a cluster gets a port of its own.

:func:`write_sbatch` writes a batch script that runs a program as N tasks of
one ``srun`` step, each building TF_CONFIG from what Slurm tells it
(``SLURM_PROCID``, the step's node list and tasks per node), with ports
``base + SLURM_PROCID``: distinct even where nodes share an address.  A task whose port is
taken on its node says so before the program starts, and names the setting that picks others.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import InfrastructureError, UsageError
from ..taskside.kerasbase import KERAS_FIX_ENV
from ..taskside.tfdata import STALL_FIX_ENV
from .agent import AgentLauncher, Probe, RemoteOptions
from .base import BOOTSTRAP
from .options import BackendOptions, option


def job_id(value: object) -> str:
    """A Slurm job id: digits (an array task's ``1234_5`` too)."""
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"\d+(_\d+)?", text):
        raise ValueError("a job id is a number, as squeue shows it")
    return text


@dataclass(frozen=True)
class _Job(BackendOptions):
    job: str | None = option(job_id, "the allocation's job id (default: $SLURM_JOB_ID)",
                             metavar="ID")


@dataclass(frozen=True)
class SlurmOptions(RemoteOptions, _Job):
    """The slurm backend's options: ``job`` (first), then the agent's, less ``hosts`` (the
    allocation's nodes are the hosts)."""


HOW_TO_ALLOCATE = (
    "start the kernel inside an allocation (salloc -N 2 jupyter lab, or in an sbatch job), or "
    "get one with 'salloc -N 2 --no-shell' and give its id: %cluster N --slurm --job ID "
    "(define_cluster(..., backend='slurm', job=ID))"
)


def _scontrol(*args: str) -> str:
    if shutil.which("scontrol") is None:
        raise InfrastructureError("Slurm's client commands (scontrol, srun) are not installed "
                                  "on this machine")
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        raise InfrastructureError(f"scontrol {' '.join(args)} failed: {said}")
    return done.stdout


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (``n[1-3],gpu7``) into names, in Slurm's order."""
    return _scontrol("show", "hostnames", nodelist).split()


def _fields(record: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"(\w+)=(\S*)", record)}


def job_nodes(job: str | int) -> list[str]:
    """The nodes of running job ``job``, in Slurm's order."""
    info = _fields(_scontrol("show", "job", "-o", str(job)))
    if info.get("JobState") != "RUNNING":
        raise InfrastructureError(f"Slurm job {job} is {info.get('JobState', 'unknown').lower()}, not "
                         f"running; {HOW_TO_ALLOCATE}")
    return hostnames(info["NodeList"])


def node_addresses(nodes: Iterable[str]) -> dict[str, str]:
    """{node: NodeAddr}: the address other nodes reach each node at."""
    out = {}
    for node in nodes:
        info = _fields(_scontrol("show", "node", "-o", node))
        out[node] = info.get("NodeAddr") or node
    return out


class SlurmLauncher(AgentLauncher):
    """Tasks as one-task job steps of a Slurm allocation."""

    name = "slurm"
    options = SlurmOptions
    # A task forked by a host's warm server would live in that server's job step (its cgroup,
    # its CPUs and memory, its accounting, its end), not in a step of its own: each spare
    # starts a warm server of its own instead, in its own step.
    warm_servers = False

    def __init__(self, options: SlurmOptions = SlurmOptions(),
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        job = options.job or environ.get("SLURM_JOB_ID")
        if not job:
            raise InfrastructureError("this kernel is not inside a Slurm allocation (SLURM_JOB_ID "
                                      f"is not set): {HOW_TO_ALLOCATE}")
        if shutil.which("srun") is None:
            raise InfrastructureError("srun is not installed on this machine; Slurm clusters "
                                      "need Slurm's client commands where the kernel runs")
        self.job = str(job)
        self.nodes = job_nodes(self.job)
        super().__init__(options, self.nodes)
        self.addresses = node_addresses(self.nodes)

    def transport(self, host: str, argv: list[str]) -> list[str]:
        return ["srun", f"--jobid={self.job}", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
                "--overlap", "--kill-on-bad-exit=1", "--quiet", "--job-name=mwhelpers",
                "--input=all", *argv]

    def describe_reach(self, host: str) -> str:
        return f"'srun --jobid={self.job} --nodelist={host} hostname'"

    def address_of(self, host: str, probe: Probe) -> str:
        return self.addresses.get(host, host)

    def explain(self, host: str, code: int, err: str) -> InfrastructureError:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if code == 127 or "no such file" in err.lower() or "execve" in err.lower():
            return InfrastructureError(f"no Python at {self.python} on node {host} ({last}); install "
                              "the same environment on every node or name one (python=...)")
        return InfrastructureError(f"cannot start a job step on node {host} of job {self.job} "
                          f"(exit {code}): {last}")


# The per-task start of the batch path: TF_CONFIG from what Slurm tells the task,
# then the program in its place (os.execv).  Run as PYTHON -c RULE SCRIPT ARGS...
TF_CONFIG_RULE = r'''
import errno, json, os, re, socket, subprocess, sys

def scontrol(*args):
    return subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True).stdout

def per_node(spec):  # "2(x3),1" -> [2, 2, 2, 1]
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out

env = os.environ
nodes = scontrol("show", "hostnames", env["SLURM_STEP_NODELIST"]).split()
counts = per_node(env["SLURM_STEP_TASKS_PER_NODE"])
order = [n for n, k in zip(nodes, counts) for _ in range(k)]  # block distribution
addr = {}
for n in nodes:
    m = re.search(r"NodeAddr=(\S+)", scontrol("show", "node", "-o", n))
    addr[n] = m.group(1) if m else n
rank = int(env["SLURM_PROCID"])
me = f"[{env['SLURMD_NODENAME']} task {rank}]"
given = env.get("MWHELPERS_PORT_BASE", "").strip()
base = int(given) if given.isdigit() else 20000 + int(env["SLURM_JOB_ID"]) % 190 * 64
if given and not (given.isdigit() and 1024 <= base <= 65536 - len(order)):
    sys.exit(f"{me} MWHELPERS_PORT_BASE={given!r} cannot give this job's {len(order)} tasks a "
             f"port each. It must be a whole number from 1024 to {65536 - len(order)}.")
workers = [f"{addr[n]}:{base + i}" for i, n in enumerate(order)]
env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                               "task": {"type": "worker", "index": rank}})
# The same place as keras.distribution.initialize() (JAX) reads it, and JAX's CPU collectives.
env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] = ",".join(workers)
env["KERAS_DISTRIBUTION_NUM_PROCESSES"] = str(len(workers))
env["KERAS_DISTRIBUTION_PROCESS_ID"] = str(rank)
env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
print(f"{me} TF_CONFIG={env['TF_CONFIG']}", flush=True)
# The port as TensorFlow's gRPC server binds it: the wildcard address, SO_REUSEADDR (gRPC takes
# IPv6's and IPv4's at once where it can).  Where it cannot, TF logs "No address added ... for
# '0.0.0.0:PORT'" and raises "Could not start gRPC server": neither says that the port is in use
# or what to do, so say that first.  The program still runs: keras.distribution on JAX listens
# on task 0's port only (JAX's coordinator).
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", base + rank))
    except OSError as e:
        what = "is in use" if e.errno == errno.EADDRINUSE else "cannot be bound"
        span = (f"port {base}" if len(workers) == 1
                else f"ports {base} to {base + len(workers) - 1}")
        todo = ("To use others, change port_base=N in write_sbatch(...) (MWHELPERS_PORT_BASE in "
                "the script) and submit again." if given else "They follow the job id, so a new "
                "submission usually gets others; write_sbatch(..., port_base=N) picks them.")
        print(f"{me} Port {base + rank} {what} on this node ({e.strerror}). A TensorFlow server "
              "here stops with \"Could not start gRPC server\". Under keras.distribution on JAX, "
              f"only task 0's port must be free. This job's tasks use {span}. {todo}",
              file=sys.stderr, flush=True)
os.execv(sys.executable, [sys.executable, "-u", *sys.argv[1:]])
'''


def write_sbatch(path: str | os.PathLike[str], script: str | os.PathLike[str], *, tasks: int = 2,
                 nodes: int | str | None = None, args: Iterable[object] = (),
                 python: str | None = None, env: Mapping[str, object] | None = None,
                 job_name: str = "tf-multiworker", output: str = "slurm-%j.out",
                 time_limit: str | int | None = None, partition: str | None = None,
                 port_base: int | str | None = None, cwd: str | os.PathLike[str] | None = None,
                 stall_fix: bool = True, keras_fix: bool = True) -> Path:
    """Write a batch script that runs ``script`` as ``tasks`` MultiWorkerMirroredStrategy
    workers (one srun step, ``--kill-on-bad-exit``: one failed worker ends the job).

    Each task starts through mwhelpers' worker start-up (``_bootstrap.py`` of this
    installation, so ``python`` must see the same files): Keras 3 ``fit`` is mended for
    multi-worker MWMS (``keras_fix=False`` runs it unmended; :mod:`mwhelpers.taskside.kerasfix`)
    and the end-of-fit stall is avoided (``stall_fix=False``; :mod:`mwhelpers.taskside.tfdata`).
    ``env``: variables to export first (``{"TF_USE_LEGACY_KERAS": "1"}``).
    Returns the path.  Submit with ``sbatch PATH``; watch with ``squeue``;
    cancel with ``scancel JOBID``.
    """
    if not isinstance(tasks, int) or tasks < 1:
        raise UsageError(f"tasks must be a whole number >= 1, got {tasks!r}")
    python = python or sys.executable
    script = str(Path(script).resolve())
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --ntasks={tasks}",
             f"#SBATCH --output={output}"]
    if nodes:
        lines.append(f"#SBATCH --nodes={nodes}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += ["# Written by mwhelpers.backends.slurm.write_sbatch: each task builds its TF_CONFIG from",
              "# SLURM_PROCID, the step's nodes and tasks per node; worker i listens on",
              "# PORT_BASE + i (distinct even where nodes share an address).",
              "set -euo pipefail"]
    if cwd:
        lines.append(f"cd {shlex.quote(str(cwd))}")
    for k, v in (env or {}).items():
        lines.append(f"export {k}={shlex.quote(str(v))}")
    if port_base:
        first = int(port_base) if str(port_base).strip().isdigit() else 0
        if not 1024 <= first <= 65536 - tasks:
            raise UsageError(f"port_base={port_base!r} cannot give {tasks} tasks a port each: "
                             f"it must be a whole number from 1024 to {65536 - tasks}")
        lines.append(f"export MWHELPERS_PORT_BASE={first}")
    lines.append(f"export {STALL_FIX_ENV}={int(bool(stall_fix))} {KERAS_FIX_ENV}={int(bool(keras_fix))}")
    lines += ["read -r -d '' TF_CONFIG_RULE <<'RULE' || true", TF_CONFIG_RULE.strip(), "RULE",
              "srun --kill-on-bad-exit=1 --distribution=block "
              + shlex.join([python, "-c"]) + ' "$TF_CONFIG_RULE" '
              + shlex.join([BOOTSTRAP, script, *map(str, args)]), ""]
    path = Path(path)
    path.write_text("\n".join(lines))
    path.chmod(0o755)
    return path
