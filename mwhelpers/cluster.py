"""A local TensorFlow cluster: jobs, tasks, ports and each task's TF_CONFIG."""

import html
import json
import re

from .errors import UsageError
from .ports import reserve_ports

JOB_TYPES = ("chief", "worker", "ps", "evaluator")
_TASK_RE = re.compile(r"^(?:(?P<type>[A-Za-z_]+)(?::(?P<index>-?\d+))?|(?P<bare>-?\d+))$")


class Task(tuple):
    """A task name: ``Task("worker", 1)`` prints as ``worker:1``."""

    def __new__(cls, type_, index):
        return super().__new__(cls, (type_, index))

    type = property(lambda self: self[0])
    index = property(lambda self: self[1])

    def __str__(self):
        return f"{self[0]}:{self[1]}"

    def __repr__(self):
        return f"Task({self[0]!r}, {self[1]})"

    @property
    def slug(self):
        """File-name friendly form: ``worker-1``."""
        return f"{self[0]}-{self[1]}"


def looks_like_task(word):
    """True when ``word`` has the form of a task name (``worker:1``, ``chief``, ``1``)."""
    return bool(_TASK_RE.match(word)) and not word.endswith(".py")


def parse_task(spec, default="worker:0"):
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


class Cluster:
    """A cluster of local tasks on reserved localhost ports.

    >>> c = Cluster(workers=2)
    >>> c.tf_config("worker:1")   # the exact JSON worker 1 gets
    """

    def __init__(self, workers=2, chief=False, ps=0, evaluator=False, host="localhost"):
        for name, value in (("workers", workers), ("ps", ps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"{name} must be a whole number >= 0, got {value!r}")
        if workers + bool(chief) < 1:
            raise UsageError("a cluster needs at least one worker or a chief")
        if ps and not workers:
            raise UsageError("parameter servers need at least one worker to compute")
        self.host = host
        self.jobs = {}
        if chief:
            self.jobs["chief"] = 1
        if workers:
            self.jobs["worker"] = workers
        if ps:
            self.jobs["ps"] = ps
        if evaluator:
            self.jobs["evaluator"] = 1
        self.tasks = [Task(t, i) for t, n in self.jobs.items() for i in range(n)]
        self._reservations = reserve_ports(len(self.tasks))
        self._ports = {t: r.port for t, r in zip(self.tasks, self._reservations)}

    # -- queries -------------------------------------------------------------
    def check_task(self, spec):
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

    def describe_tasks(self):
        return ", ".join(str(t) for t in self.tasks)

    def port(self, task):
        return self._ports[self.check_task(task)]

    def address(self, task):
        return f"{self.host}:{self.port(task)}"

    @property
    def ports(self):
        return dict(self._ports)

    @property
    def num_workers(self):
        """Tasks that train under MultiWorkerMirroredStrategy (chief + workers)."""
        return self.jobs.get("chief", 0) + self.jobs.get("worker", 0)

    def cluster_spec(self):
        """The ``cluster`` part of TF_CONFIG: job name -> list of addresses."""
        return {
            job: [f"{self.host}:{self._ports[Task(job, i)]}" for i in range(n)]
            for job, n in self.jobs.items()
        }

    def tf_config(self, task):
        """The exact TF_CONFIG JSON string for ``task``."""
        task = self.check_task(task)
        return json.dumps(
            {"cluster": self.cluster_spec(), "task": {"type": task.type, "index": task.index}}
        )

    # -- life cycle ----------------------------------------------------------
    def close(self):
        """Give the ports back (other notebooks may then use them)."""
        for r in self._reservations:
            r.release()

    @property
    def closed(self):
        return not any(r.held for r in self._reservations)

    # -- display -------------------------------------------------------------
    def _rows(self):
        return [(str(t), self._ports[t], self.tf_config(t)) for t in self.tasks]

    def __repr__(self):
        parts = [f"{n} {job}" for job, n in self.jobs.items()]
        lines = [f"Cluster({', '.join(parts)}) on {self.host}"]
        width = max(len(r[0]) for r in self._rows())
        for task, port, cfg in self._rows():
            lines.append(f"  {task:<{width}}  port {port}  TF_CONFIG={cfg}")
        return "\n".join(lines)

    def _repr_html_(self):
        rows = "".join(
            f"<tr><td><b>{html.escape(t)}</b></td><td>{p}</td>"
            f"<td><code>{html.escape(c)}</code></td></tr>"
            for t, p, c in self._rows()
        )
        return (
            f"<p>Local cluster: {html.escape(', '.join(f'{n} {j}' for j, n in self.jobs.items()))}"
            f" on <code>{html.escape(self.host)}</code></p>"
            "<table><thead><tr><th>task</th><th>port</th><th>TF_CONFIG</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
