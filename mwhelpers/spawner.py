"""What makes the processes of one cluster's tasks: the checks of a launch, each task's spec,
environment and log, its start through the backend, and the run that records it.

A :class:`Spawner` is made with its cluster (by :class:`~mwhelpers.workers.Runtime` when it
defines one) and given to every :class:`~mwhelpers.job.Job` of that cluster: the jobs call
it, and the supervisor its standbys, through a job.  Its public surface:

* :meth:`Spawner.check`: the tasks of some launch requests, each in the cluster, not running,
  its port free, given once; each program of the launch looked at once
  (:class:`~mwhelpers.precheck.Lookout`; tasks that run the same program with the same
  environment share one look);
* :meth:`Spawner.spawn`: one task's process started (or a standby released) and its
  :class:`~mwhelpers.taskrun.TaskRun`;
* :meth:`Spawner.spawn_standby` and :meth:`Spawner.discard_standby`: a process started
  ahead for a restart, and one no restart needed;
* :meth:`Spawner.probe`: whether a run's server accepts connections.

What every task gets from the runtime's settings is a :class:`TaskDefaults`, shared with the
runtime (``rt.defaults``), read at each spawn; log names come from :class:`LogNames`, which
outlives clusters so that a task's logs are never overwritten within a runtime.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import exitrecord, settings
from .backends import create_backend, pick_backend
from .backends.base import LaunchSpec
from .cluster import Cluster, job_tasks
from .ending import end
from .errors import UsageError
from .gpus import assign, check_per_task
from .ports import holder_of, port_in_use, port_range
from .precheck import Lookout, initializes_jax
from .taskrun import LaunchRequest, RunReady, Standby, TaskRun
from .taskside.kerasbase import KERAS_FIX_ENV
from .taskside.tfdata import STALL_FIX_ENV
from .taskside.wire import Env
from .watcher import SERVER_JOBS

if TYPE_CHECKING:
    from .backends.base import Launcher, Process
    from .cluster import Task
    from .follow import Follower
    from .services import Services

GRPC_OPTIONS_ENV = "TF_GRPC_DEFAULT_OPTIONS"  # read by TensorFlow's gRPC channels
RECONNECT_OPTION = "grpc.initial_reconnect_backoff_ms"


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within half a second."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


JAX_CPU_COLLECTIVES = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"  # JAX's flag, read from the environment


def fast_reconnect(env: Mapping[str, str], ms: int) -> dict[str, str]:
    """``TF_GRPC_DEFAULT_OPTIONS`` for a task with gRPC's first reconnect back-off at ``ms``.

    A task that dials a peer whose server is not up yet (its TensorFlow import took longer)
    waits out gRPC's first back-off, 1 s by default, before it tries again: about half of
    all starts and restarts of a two-task job formed its cluster 0.7 to 1.2 s late
    (``benchmarks/bench_restart.py``).  TensorFlow reads ``name=value`` pairs, separated by
    commas, from that variable for its channels; the option is added to what is there,
    unless the task's environment names it already, or ``ms`` is 0
    (``MWHELPERS_RECONNECT_MS=0``)."""
    given = env.get(GRPC_OPTIONS_ENV, "")
    if not ms or RECONNECT_OPTION in given:
        return {}
    return {GRPC_OPTIONS_ENV: ",".join(filter(None, [given, f"{RECONNECT_OPTION}={ms}"]))}


def open_cluster(workers: int, chief: bool, ps: int, evaluator: bool,
                 gpus_per_task: int | None, backend: str | None,
                 options: Mapping[str, object], services: Services) -> tuple[Cluster, Launcher]:
    """A new cluster of these tasks, placed by its backend (``backend``, or the one that
    takes every option: :func:`~mwhelpers.backends.pick_backend`), and that backend, lent
    what the runtime owns (``services``); with ``gpus_per_task``, the GPUs of each task.
    Nothing is left held when it fails."""
    check_per_task(gpus_per_task)
    name = backend or pick_backend(options)
    tasks = job_tasks(workers, chief, ps, evaluator)
    launcher = create_backend(name, options, services)
    cluster = None
    try:
        cluster = Cluster(workers=workers, chief=chief, ps=ps, evaluator=evaluator,
                          placement=launcher.place(tasks, port_range()), kind=name,
                          remote=launcher.remote)
        if gpus_per_task:
            cluster.gpus = assign({t: cluster.host_of(t) for t in tasks}, launcher.host_gpus(),
                                  gpus_per_task)
    except BaseException:
        if cluster is not None:
            cluster.close()  # gives back the ports the backend held for it
        launcher.close()
        raise
    return cluster, launcher


@dataclass
class TaskDefaults:
    """What every task gets unless its launch says otherwise; set on the runtime as
    ``rt.defaults`` (read at each launch)."""

    # The end-of-fit stall fix in every worker (tfdata.py); per launch: stall_fix=.
    stall_fix: bool = field(default_factory=lambda: settings.STALL_FIX.read())
    # Keras 3 fit under multi-worker MWMS mended in every worker (kerasfix.py); per launch:
    # keras_fix=.
    keras_fix: bool = field(default_factory=lambda: settings.KERAS_FIX.read())
    # gRPC's first reconnect back-off in every task, in ms (0: gRPC's own, 1 s); see
    # fast_reconnect.
    reconnect_ms: int = field(default_factory=lambda: settings.RECONNECT_MS.read())


class LogNames:
    """Each launch's log path in ``folder()``: ``worker_0.log``, then ``worker_0.run2.log``...
    A launch number given back (a standby no restart needed) goes to the task's next launch."""

    def __init__(self, folder: Callable[[], Path]) -> None:
        self.folder = folder
        self._counts: dict[Task, int] = {}

    def next(self, task: Task) -> tuple[Path, int]:
        """The next log path of ``task`` and its launch number."""
        n = self._counts.get(task, 0) + 1
        self._counts[task] = n
        return self.folder() / f"{task.slug}{'' if n == 1 else f'.run{n}'}.log", n

    def give_back(self, task: Task, number: int) -> None:
        """Launch ``number`` of ``task`` was not used (when it is still the last given)."""
        if self._counts.get(task) == number:
            self._counts[task] = number - 1

    def reuse(self, task: Task, number: int) -> None:
        """The next launch of ``task`` gets ``number`` again (a standby that died waiting)."""
        self._counts[task] = number - 1


class Spawner:
    """Starts the tasks of ``cluster`` through ``launcher`` (see the module's text)."""

    def __init__(self, cluster: Cluster, launcher: Launcher, defaults: TaskDefaults,
                 names: LogNames, lookout: Lookout, follower: Follower) -> None:
        self.cluster = cluster
        self.launcher = launcher
        self.follower = follower  # the runtime's, which reads each run's log (mwhelpers.follow)
        self.defaults = defaults
        self.names = names
        self.lookout = lookout
        self._warnings: dict[Task, list[str]] = {}  # the look's warnings of each task's program
        # What its tasks will start with, so that the backend can start things ahead of them
        base = launcher.task_env(os.environ)
        envs: dict[str | None, list[dict[str, str]]] = {}
        for task in cluster.tasks:
            envs.setdefault(cluster.host_of(task), []).append(
                self._environment(task, LaunchRequest(task), 0, base))
        launcher.prepare(envs)

    # -- checks ------------------------------------------------------------------------
    def check(self, requests: Sequence[LaunchRequest], latest: Mapping[Task, TaskRun],
              look: bool = True) -> list[Task]:
        """The tasks of ``requests``, once each is known to be in the cluster, not running
        (``latest``: the latest run of each task), (here) its port free, and given once; with
        ``look``, each program looked at before its launch (warnings only)."""
        tasks = [self.cluster.check_task(r.task) for r in requests]
        twice = sorted({str(t) for t in tasks if tasks.count(t) > 1})
        if twice:
            raise UsageError(f"{', '.join(twice)} given more than once; start each task once")
        for task in tasks:
            run = latest.get(task)
            if run is not None and run.running:
                raise UsageError(
                    f"{task} is already running (pid {run.pid}, for {run.uptime:.0f} s); "
                    f"wait for it (%waitworkers) or end it (%killworker {task}) first")
            if task.type in SERVER_JOBS and not self.cluster.remote:
                port = self.cluster.port(task)
                if port_in_use(port):
                    raise UsageError(
                        f"port {port} of {task} is already taken by {holder_of(port)}; end "
                        "that process, or define the cluster again (%cluster) to get new ports")
        if look:  # once per program: the tasks of launch_all run the same one
            programs: dict[tuple[object, ...], list[tuple[Task, LaunchRequest]]] = {}
            for task, r in zip(tasks, requests, strict=True):
                key = (r.code, r.script, tuple(sorted(r.env.items())), self._keras_fix(r))
                programs.setdefault(key, []).append((task, r))
            for (*_, keras_fix), launched in programs.items():
                processes = {str(t): self.cluster.keras_distribution(t) for t, _ in launched}
                warnings = self.lookout.look(launched[0][1], self.launcher.python,
                                             bool(keras_fix), processes)
                self._warnings.update((t, warnings) for t, _ in launched)
        return tasks

    # -- starting ----------------------------------------------------------------------
    def spawn(self, task: Task, request: LaunchRequest, attempt: int,
              standby: Standby | None = None) -> TaskRun:
        """Start one task's process and make its run: ``standby``'s process, released, when it
        was started ahead for this and still runs; a new one otherwise."""
        if standby is not None and standby.process.running:
            try:
                standby.process.release()
            except OSError:  # it died at this very moment: as below
                pass
            else:
                return self._run(task, standby.process, standby.spec, standby.ready, attempt,
                                 self._keras_fix(request))
        if standby is not None:  # it died waiting: a cold start, under the number it had
            self.names.reuse(task, standby.number)
            standby.replaced = True
        spec, ready, _ = self._spec(task, request, attempt)
        return self._run(task, self.launcher.start(spec), spec, ready, attempt,
                         self._keras_fix(request))

    def spawn_standby(self, task: Task, request: LaunchRequest, attempt: int) -> Standby | None:
        """Start ``task``'s process for ``attempt`` ahead (None where the backend cannot):
        TensorFlow imported, it waits until :meth:`spawn` releases it.  Not a run until then;
        :meth:`discard_standby` ends one that is not needed."""
        if not self.launcher.standby or request.log:  # a log of its own would be truncated
            return None
        spec, ready, number = self._spec(task, request, attempt, standby=True)
        try:
            process = self.launcher.start(spec)
        except BaseException:  # its launch number goes back to the task's next launch
            self.names.give_back(task, number)
            raise
        return Standby(task, process, spec, ready, attempt, number)

    def discard_standby(self, standby: Standby) -> None:
        """End a standby that no restart needed, remove its log, and give its launch number
        back (the next launch of its task gets it); one a cold start replaced keeps both."""
        end([(standby.process, str(standby.task))])
        if standby.replaced:
            return
        self.names.give_back(standby.task, standby.number)
        standby.spec.log_path.unlink(missing_ok=True)  # the kernel writes every task's log

    def probe(self, run: TaskRun) -> bool:
        """True once ``run``'s server accepts connections where TF_CONFIG says it is."""
        return port_accepts(run.port, self.cluster.connect_address(run.task))

    # -- what a task gets --------------------------------------------------------------
    def _environment(self, task: Task, request: LaunchRequest, attempt: int,
                    base: Mapping[str, str]) -> dict[str, str]:
        """The environment ``task``'s program gets: ``base`` (what the backend passes on),
        TF_CONFIG and mwhelpers' variables, then the request's own; and gRPC's first
        reconnect back-off (see :func:`fast_reconnect`)."""
        env = dict(base)
        # The kernel's inline plotting backend means nothing in a worker.
        if "inline" in os.environ.get("MPLBACKEND", ""):
            env["MPLBACKEND"] = "Agg"
        env["TF_CONFIG"] = self.cluster.tf_config(task)
        keras_distribution = self.cluster.keras_distribution(task)
        env.update(keras_distribution)  # the same place, as keras.distribution (JAX) reads it
        if keras_distribution:  # JAX's collectives across processes on CPUs
            env.setdefault(JAX_CPU_COLLECTIVES, "gloo")
        if self.cluster.gpus is not None:  # its own GPUs (a --env given at launch still wins)
            # (none for a task that the cluster's GPU map leaves out, as its table says)
            env["CUDA_VISIBLE_DEVICES"] = self.cluster.gpus_of(task) or ""
        env[Env.TASK] = str(task)
        env[Env.ATTEMPT] = str(attempt)
        stall_fix = self.defaults.stall_fix if request.stall_fix is None else request.stall_fix
        env[STALL_FIX_ENV] = "1" if stall_fix else "0"
        env[KERAS_FIX_ENV] = "1" if self._keras_fix(request) else "0"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(request.env)
        env.update(fast_reconnect(env, self.defaults.reconnect_ms))
        return env

    def _keras_fix(self, request: LaunchRequest) -> bool:
        """Whether ``request``'s task mends Keras 3 (:mod:`mwhelpers.taskside.kerasfix`): its own
        ``env`` decides when it names the switch, then its ``keras_fix``, then the default."""
        if KERAS_FIX_ENV in request.env:
            return settings.KERAS_FIX.read(request.env)
        return self.defaults.keras_fix if request.keras_fix is None else request.keras_fix

    def _spec(self, task: Task, request: LaunchRequest, attempt: int,
              standby: bool = False) -> tuple[LaunchSpec, RunReady, int]:
        """What starts ``task`` for ``request`` in ``attempt``, its readiness mode and its
        launch number."""
        if request.log:
            log_path, number = request.log, 0
        else:
            log_path, number = self.names.next(task)
        if request.code is not None:
            script = self.names.folder() / f"{task.slug}_cell.py"
            # Written beside and renamed over: a run of the task that reads its earlier copy
            # now (a standby released a moment ago) gets all of one or all of the other.
            partial = script.with_name(f".{script.name}.{os.getpid()}.{threading.get_ident()}")
            partial.write_text(request.code)
            os.replace(partial, script)
        else:
            assert request.script is not None  # a request holds code or a script
            script = request.script
        ready: RunReady = self._ready(task, request, script)
        # The backend says what a task's environment starts from (another machine gets the
        # variables that matter, not the kernel's whole environment) and fills in its folder.
        base = self.launcher.task_env(os.environ)
        spec = LaunchSpec(script=str(Path(script).resolve()), args=list(request.args),
                          env=self._environment(task, request, attempt, base),
                          log_path=Path(log_path), cell=request.code is not None,
                          host=self.cluster.host_of(task), port=self.cluster.port(task),
                          standby=standby)
        spec.env[Env.EXIT_RECORD] = str(exitrecord.path_for(spec.log_path))
        return spec, ready, number

    def _ready(self, task: Task, request: LaunchRequest, script: Path) -> RunReady:
        """How ``task``'s readiness is known: its ``ready``, or by default its port for the
        tasks that start a TensorFlow server on it, except a process other than 0 of Keras 3
        on JAX, which opens none (only JAX's coordinator, on process 0's port, does): ready
        once started."""
        if request.ready != "auto":
            return request.ready
        if task.type not in SERVER_JOBS:
            return "start"
        process = self.cluster.keras_distribution(task).get("KERAS_DISTRIBUTION_PROCESS_ID")
        if process not in (None, "0"):
            try:
                source = request.code if request.code is not None else script.read_text(
                    encoding="utf-8", errors="replace")
            except OSError:
                return "port"
            if initializes_jax(source):
                return "start"
        return "port"

    def _run(self, task: Task, process: Process, spec: LaunchSpec, ready: RunReady,
             attempt: int, keras_fix: bool) -> TaskRun:
        """The run of ``process``, started from ``spec`` (``keras_fix``: its start-up mends
        Keras 3)."""
        cluster = self.cluster
        run = TaskRun(task, process, spec.log_path, cluster.port(task), cluster.address(task),
                      ready, spec.script, self.follower, attempt=attempt, cwd=spec.cwd,
                      host=spec.host, cell=spec.cell)
        if cluster.gpus is not None:
            run.gpus = spec.env.get("CUDA_VISIBLE_DEVICES", "")
        run.keras_fix = keras_fix
        run.warnings = list(self._warnings.get(task, ()))
        return run
