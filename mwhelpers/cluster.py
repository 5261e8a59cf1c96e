"""A TensorFlow cluster: jobs, tasks, where each runs, ports and each task's TF_CONFIG."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from typing import cast

from .errors import UsageError
from .ports import PortHold, reserve_ports
from .taskname import Task as Task  # re-exported: the package names it mwhelpers.cluster.Task

JOB_TYPES = ("chief", "worker", "ps", "evaluator")
_TASK_RE = re.compile(r"^(?:(?P<type>[A-Za-z_]+)(?::(?P<index>-?\d+))?|(?P<bare>-?\d+))$")
# Where a task runs: (host as its launcher reaches it or None for this machine, address as
# TF_CONFIG names it, port), and in a backend's placement, what holds the port
# (mwhelpers.backends.Placement).
Place = tuple[str | None, str, int]
HeldPlace = tuple[str | None, str, int, PortHold | None]


def looks_like_task(word: str) -> bool:
    """True when ``word`` has the form of a task name (``worker:1``, ``chief``, ``1``)."""
    return bool(_TASK_RE.match(word)) and not word.endswith(".py")


def parse_task(spec: str | int | tuple[str, int] | Task | None, default: str = "worker:0") -> Task:
    """Parse ``worker:1``, ``chief``, ``1`` (= ``worker:1``) or a Task.

    Checks only the form; :meth:`Cluster.check_task` checks membership.
    """
    if isinstance(spec, Task):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return parse_task(f"{spec[0]}:{spec[1]}")
    if isinstance(spec, int):
        spec = str(spec)
    if spec is None or str(spec).strip() == "":
        spec = default
    text = str(spec).strip()
    m = _TASK_RE.match(text)
    if not m:
        raise UsageError(
            f"{text!r} is not a task name; write TYPE:INDEX such as worker:1, chief:0, "
            "ps:0, evaluator:0 (or just 1 for worker:1)"
        )
    if m.group("bare") is not None:
        type_, index = "worker", int(m.group("bare"))
    else:
        type_ = m.group("type").lower()
        index = int(m.group("index")) if m.group("index") is not None else 0
    if type_ not in JOB_TYPES:
        raise UsageError(
            f"unknown task type {type_!r} in {text!r}; use one of "
            f"{', '.join(JOB_TYPES)} (for example worker:1)"
        )
    if index < 0:
        raise UsageError(f"task index must be 0 or more, got {index} in {text!r}")
    return Task(type_, index)


def check_shape(workers: int, chief: bool, ps: int) -> None:
    """Raise UsageError unless a cluster of that shape makes sense."""
    for name, value in (("workers", workers), ("ps", ps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UsageError(f"{name} must be a whole number >= 0, got {value!r}")
    if workers + bool(chief) < 1:
        raise UsageError("a cluster needs at least one worker or a chief")
    if ps and not workers:
        raise UsageError("parameter servers need at least one worker to compute")


def job_tasks(workers: int = 2, chief: bool = False, ps: int = 0,
              evaluator: bool = False) -> list[Task]:
    """The tasks of a cluster of that shape, in TF_CONFIG order."""
    check_shape(workers, chief, ps)
    jobs = {"chief": 1 if chief else 0, "worker": workers, "ps": ps,
            "evaluator": 1 if evaluator else 0}
    return [Task(t, i) for t, n in jobs.items() for i in range(n)]


class Cluster:
    """A cluster of tasks and their ports.

    Local (default): every task on ``host`` at a port reserved on this machine.
    Placed by a backend: ``placement`` gives ``{task: (host, address, port[, hold])}``
    (:class:`mwhelpers.backends.Placement`), where ``host`` is how the backend reaches
    it (an SSH destination, a Slurm node; None: this machine), ``address`` is what
    TF_CONFIG names (reachable by the others) and ``hold`` keeps the port reserved until
    :meth:`close`.  ``kind`` names the backend; ``remote``: its tasks run elsewhere
    (default: any backend but ``local``).

    >>> c = Cluster(workers=2)
    >>> c.tf_config("worker:1")   # the exact JSON worker 1 gets
    """

    def __init__(self, workers: int = 2, chief: bool = False, ps: int = 0, evaluator: bool = False,
                 host: str = "localhost",
                 placement: Mapping[Task, Place | HeldPlace] | None = None,
                 kind: str = "local", gpus: Mapping[Task, str] | None = None,
                 remote: bool | None = None) -> None:
        self.host = host
        # {task: "0,1"}: each task's CUDA_VISIBLE_DEVICES (mwhelpers.gpus.assign); None: not set
        self.gpus = dict(gpus) if gpus else None
        self.tasks = job_tasks(workers, chief, ps, evaluator)
        self.jobs: dict[str, int] = {}
        for t in self.tasks:
            self.jobs[t.type] = self.jobs.get(t.type, 0) + 1
        self.kind = kind
        self._remote = kind != "local" if remote is None else bool(remote)
        self._closed = False
        self._places: dict[Task, Place]
        self._reservations: list[PortHold]
        if placement is None:
            reserved = reserve_ports(len(self.tasks))
            self._reservations = list(reserved)
            self._ports = {t: r.port for t, r in zip(self.tasks, reserved, strict=True)}
            self._places = {t: (None, host, self._ports[t]) for t in self.tasks}
        else:
            given = {t: tuple(placement[t]) for t in self.tasks}
            self._places = {t: cast(Place, p[:3]) for t, p in given.items()}
            self._reservations = [cast(PortHold, p[3]) for p in given.values()
                                  if len(p) > 3 and p[3] is not None]
            if not self._remote:
                self.host = self._places[self.tasks[0]][1]
            self._ports = {t: p[2] for t, p in self._places.items()}

    # -- queries -------------------------------------------------------------
    def check_task(self, spec: str | int | Task) -> Task:
        """Parse ``spec`` and make sure the task is part of this cluster."""
        task = parse_task(spec)
        n = self.jobs.get(task.type, 0)
        if n == 0:
            hint = {
                "chief": "%cluster N --chief",
                "ps": "%cluster N --ps K",
                "evaluator": "%cluster N --evaluator",
                "worker": "%cluster N",
            }[task.type]
            raise UsageError(
                f"{task} is not in this cluster: it has no {task.type} job "
                f"(tasks: {self.describe_tasks()}). Define one with {hint}"
            )
        if task.index >= n:
            raise UsageError(
                f"{task} is outside the cluster: the {task.type} job has {n} task"
                f"{'s' if n != 1 else ''} ({task.type}:0..{task.type}:{n - 1}). "
                f"Define a bigger cluster to use it"
            )
        return task

    def describe_tasks(self) -> str:
        return ", ".join(str(t) for t in self.tasks)

    def port(self, task: str | int | Task) -> int:
        return self._ports[self.check_task(task)]

    def address(self, task: str | int | Task) -> str:
        """``address:port`` of ``task`` as TF_CONFIG names it."""
        _, addr, port = self._places[self.check_task(task)]
        return f"{addr}:{port}"

    def host_of(self, task: str | int | Task) -> str | None:
        """Where ``task`` runs: None for this machine, else the launcher's host name."""
        return self._places[self.check_task(task)][0]

    def connect_address(self, task: str | int | Task) -> str:
        """The address to probe ``task``'s port at from this machine."""
        return self._places[self.check_task(task)][1]

    @property
    def remote(self) -> bool:
        return self._remote

    @property
    def ports(self) -> dict[Task, int]:
        return dict(self._ports)

    @property
    def num_workers(self) -> int:
        """Tasks that train under MultiWorkerMirroredStrategy (chief + workers)."""
        return self.jobs.get("chief", 0) + self.jobs.get("worker", 0)

    def cluster_spec(self) -> dict[str, list[str]]:
        """The ``cluster`` part of TF_CONFIG: job name -> list of addresses."""
        return {job: [self.address(Task(job, i)) for i in range(n)]
                for job, n in self.jobs.items()}

    def tf_config(self, task: str | int | Task) -> str:
        """The exact TF_CONFIG JSON string for ``task``."""
        task = self.check_task(task)
        return json.dumps(
            {"cluster": self.cluster_spec(), "task": {"type": task.type, "index": task.index}}
        )

    def processes(self) -> list[Task]:
        """The tasks that train together (chief first, then the workers): the processes of
        ``keras.distribution`` and JAX, numbered from 0 in this order."""
        return [t for t in self.tasks if t.type in ("chief", "worker")]

    def keras_distribution(self, task: str | int | Task) -> dict[str, str]:
        """What ``keras.distribution.initialize()`` reads (Keras's ``KERAS_DISTRIBUTION_*``
        variables: every process's address, their number, this one's id; JAX makes process
        0's address its coordinator) for ``task``; {} for a task that does not train (ps,
        evaluator)."""
        task = self.check_task(task)
        processes = self.processes()
        if task not in processes:
            return {}
        return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(map(self.address, processes)),
                "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(processes)),
                "KERAS_DISTRIBUTION_PROCESS_ID": str(processes.index(task))}

    # -- life cycle ----------------------------------------------------------
    def close(self) -> None:
        """Give the ports back (other notebooks may then use them)."""
        for r in self._reservations:
            r.release()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # -- display -------------------------------------------------------------
    def gpus_of(self, task: str | int | Task) -> str | None:
        """The GPU ids ``task`` gets (``"0,1"``), or None when the cluster assigns none."""
        return None if self.gpus is None else self.gpus.get(self.check_task(task))

    def _rows(self) -> list[tuple[str, str, int, str | None, str]]:
        """(task, host, port, GPUs or None when the cluster assigns none, TF_CONFIG)."""
        return [(str(t), self.host_of(t) or "this machine", self._ports[t],
                 None if self.gpus is None else self.gpus.get(t) or "none", self.tf_config(t))
                for t in self.tasks]

    def _where(self) -> str:
        if not self.remote:
            return f"on {self.host}"
        hosts = list(dict.fromkeys(p[0] or "this machine" for p in self._places.values()))
        return f"over {self.kind} on {', '.join(hosts)}"

    def __repr__(self) -> str:
        parts = [f"{n} {job}" for job, n in self.jobs.items()]
        lines = [f"Cluster({', '.join(parts)}) {self._where()}"]
        rows = self._rows()
        width = max(len(r[0]) for r in rows)
        for task, host, port, gpus, cfg in rows:
            where = f"  on {host}" if self.remote else ""
            gpus = "" if gpus is None else f"  GPUs {gpus}"
            lines.append(f"  {task:<{width}}{where}  port {port}{gpus}  TF_CONFIG={cfg}")
        lines.append(f"  {self._keras_line()}")
        return "\n".join(lines)

    def _keras_line(self) -> str:
        """What the training tasks get for keras.distribution (JAX), in one line."""
        processes = self.processes()
        if not processes:
            return "(no chief or worker: no keras.distribution variables)"
        first = self.keras_distribution(processes[0])
        return ("keras.distribution.initialize() (JAX): KERAS_DISTRIBUTION_JOB_ADDRESSES="
                f"{first['KERAS_DISTRIBUTION_JOB_ADDRESSES']}, KERAS_DISTRIBUTION_NUM_PROCESSES="
                f"{first['KERAS_DISTRIBUTION_NUM_PROCESSES']}, KERAS_DISTRIBUTION_PROCESS_ID="
                + ", ".join(f"{i} on {t}" for i, t in enumerate(processes)))

    def _repr_html_(self) -> str:
        gpu_head = "<th>GPUs</th>" if self.gpus is not None else ""
        rows = "".join(
            f"<tr><td><b>{html.escape(t)}</b></td><td>{html.escape(h)}</td><td>{p}</td>"
            + ("" if g is None else f"<td>{html.escape(g)}</td>")
            + f"<td><code>{html.escape(c)}</code></td></tr>"
            for t, h, p, g, c in self._rows()
        )
        title = "Local cluster" if not self.remote else "Cluster"
        return (
            f"<p>{title}: {html.escape(', '.join(f'{n} {j}' for j, n in self.jobs.items()))}"
            f" {html.escape(self._where())}</p>"
            f"<table><thead><tr><th>task</th><th>host</th><th>port</th>{gpu_head}<th>TF_CONFIG</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>"
            f"<p><small>{html.escape(self._keras_line())}</small></p>"
        )
