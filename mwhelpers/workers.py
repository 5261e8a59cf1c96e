"""The worker runtime: launch, watch, wait for, kill and supervise task processes.

One :class:`Runtime` per kernel (``mwhelpers.runtime()`` returns it); the
magics are a thin layer over its public methods, and scripts can use it
directly, best as a context manager (``with Runtime() as rt: ...``) so that
its processes and its guard pipe are released when done.

The pieces it is made of, one module each: :mod:`.taskrun` (a checked launch
request, a task's run and its state), :mod:`.launchers` (starting,
signalling and reaping a process), :mod:`.logs` (log files),
:mod:`.failures` (failure records and their report), :mod:`.status` (the
status table) and :mod:`.supervisor` (restart on faults).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from . import proctree, results, settings, supervisor
from .backends import create_backend, pick_backend
from .backends.base import Launcher, LaunchSpec, Process
from .cluster import Cluster, Task, job_tasks, parse_task
from .errors import UsageError
from .failures import Failure
from .gpus import assign, check_per_task
from .job import Job
from .kerasfix import KERAS_FIX_ENV
from .logs import LogFollower
from .packages import installed
from .ports import holder_of, port_in_use, port_range
from .precheck import check
from .status import StatusTable
from .taskrun import LaunchRequest, Standby, TaskRun, parse_timeout
from .tfdata import STALL_FIX_ENV
from .timeline import Timeline
from .timeouts import not_ready_error
from .watcher import SERVER_JOBS, CellLimits, await_ready, cell_limits

if TYPE_CHECKING:
    from .interactive import Interactive

TaskSpec = str | int | Task  # "worker:1", 1 (worker:1), "chief", Task("worker", 1)

SESSION_ENV = "MWHELPERS_SESSION"
# Set (to the session mark) in what a %%script --bg cell starts: its escaped descendants are
# ended by %killbgscripts, other background commands of the kernel are not.
BG_ENV = "MWHELPERS_BG"
TRAINING_JOBS = ("chief", "worker")  # tasks that wait for each other (collectives)


def _print(line: str) -> None:
    print(line, flush=True)


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def default_log_dir(session_name: str | None = None) -> Path:
    setting: str | None = settings.get("MWHELPERS_LOG_DIR")
    root = Path(setting) if setting else Path.cwd() / "worker_logs"
    name = session_name or os.environ.get("JPY_SESSION_NAME") or "kernel"
    stem = Path(name).stem or "kernel"
    return root / f"{stem}-{os.getpid()}"


GRPC_OPTIONS_ENV = "TF_GRPC_DEFAULT_OPTIONS"  # read by TensorFlow's gRPC channels
RECONNECT_OPTION = "grpc.initial_reconnect_backoff_ms"


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


def claim_session() -> str:
    """This process's session mark, set in its environment.

    Every process started from here from now on (also through %%bash --bg
    and !cmd) inherits it, so escaped orphans can be found.  A mark
    inherited from a parent process (a kernel started by another process
    that uses mwhelpers) is replaced: orphans of ours are only ours.
    """
    mark = os.environ.get(SESSION_ENV, "")
    if not mark.startswith(f"{os.getpid()}-"):
        mark = f"{os.getpid()}-{secrets.token_hex(4)}"
        os.environ[SESSION_ENV] = mark
    return mark


class Runtime:
    """Launches and tracks the task processes of one kernel (or script)."""

    def __init__(self, log_dir: str | os.PathLike[str] | None = None,
                 echo: Callable[[str], None] = _print) -> None:
        self._log_dir = Path(log_dir) if log_dir else None
        self.echo = echo
        self.cluster: Cluster | None = None
        self.job: Job | None = None  # the current attempt's Job (mwhelpers.job)
        self.runs: dict[Task, TaskRun] = {}  # Task -> latest TaskRun
        self.history: list[TaskRun] = []  # every TaskRun, oldest first
        self._launch_counts: dict[Task, int] = {}
        # (program text hash, warning) already said (precheck)
        self._warned: set[tuple[int, str]] = set()
        self._cluster_from = 0  # index in history of the current cluster's first run
        self._lock = threading.RLock()
        self.launcher: Launcher | None = None  # the current cluster's backend (mwhelpers.backends)
        self._launchers: list[Launcher] = []  # it, for the finalizer
        self.session = claim_session()
        # The end-of-fit stall fix in every worker (tfdata.py); per launch: stall_fix=.
        self.stall_fix: bool = settings.get("MWHELPERS_STALL_FIX")
        # Keras 3 fit under multi-worker MWMS mended in every worker (kerasfix.py); per
        # launch: keras_fix=.
        self.keras_fix: bool = settings.get("MWHELPERS_KERAS_FIX")
        # gRPC's first reconnect back-off in every task, in ms (0: gRPC's own, 1 s); see
        # fast_reconnect.
        self.reconnect_ms: int = settings.get("MWHELPERS_RECONNECT_MS")
        # Cells show a task's output without TF's informational C++ lines (logs keep them).
        self.verbose = False
        # How much of a task's output a cell shows (mwhelpers.watcher.CellLimits): the
        # process's own, mwhelpers.watcher.cell_limits (rt.cell_limits.head = 1000, say).
        self.cell_limits: CellLimits = cell_limits
        # The ipyparallel engines of the current cluster's tasks, once asked for
        # (mwhelpers.interactive; started by interactive()).
        self._interactive: Interactive | None = None
        # At exit (or when this object is collected) the launchers end what still runs.
        self._finalizer = weakref.finalize(self, _close_launchers, self._launchers)

    # -- life cycle ------------------------------------------------------------
    def close(self) -> None:
        """End every task, give the cluster's ports back and release the launcher."""
        if not self._finalizer.alive:
            return
        with self._lock:
            self._close_interactive()
            self.end(self.running_runs(), "ended when the runtime was closed", "now")
            if self.cluster is not None:
                self.cluster.close()
        self._finalizer()
        self.launcher = None

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- cluster -------------------------------------------------------------
    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._log_dir = default_log_dir()
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir

    @log_dir.setter
    def log_dir(self, value: str | os.PathLike[str]) -> None:
        self._log_dir = Path(value)

    def use_session_name(self, name: str | None) -> None:
        """Name the default log folder after the notebook (unless one was set)."""
        if self._log_dir is None and name:
            self._log_dir = default_log_dir(name)

    def _resolve(self, spec: TaskSpec) -> Task:
        """A task name checked against the cluster when there is one."""
        return self.cluster.check_task(spec) if self.cluster else parse_task(spec)

    def running_runs(self) -> list[TaskRun]:
        return [r for r in self.runs.values() if r.running]

    def define_cluster(self, workers: int = 2, chief: bool = False, ps: int = 0,
                       evaluator: bool = False, gpus_per_task: int | None = None,
                       backend: str | None = None, **options: Any) -> Cluster:
        """Replace the current cluster (its ports are released, its backend closed).

        ``backend`` names how the tasks are started (:mod:`mwhelpers.backends`):
        ``"local"`` (this machine), ``"ssh"``, ``"slurm"`` or one a package
        registered; the other keyword arguments are that backend's options, checked
        against what it declares (``%cluster --backend NAME --help`` lists them).
        Without ``backend``: the one backend that takes every option given, so
        ``hosts=["node1", "me@node2"]`` means ``ssh`` (tasks placed over these hosts in
        turn, TF_CONFIG naming the address each host was reached at) and ``job=ID``
        means ``slurm`` (the nodes of that allocation); no option means ``local``
        (``host=`` names the address TF_CONFIG gives, default localhost).
        ``gpus_per_task=K``: each task gets K GPUs of its host of its own, as
        ``CUDA_VISIBLE_DEVICES`` (see :mod:`mwhelpers.gpus`); UsageError when a host has
        too few.  A host that cannot be used raises
        :class:`~mwhelpers.errors.InfrastructureError`.
        """
        check_per_task(gpus_per_task)
        name = backend or pick_backend(options)
        tasks = job_tasks(workers, chief, ps, evaluator)
        with self._lock:
            if self._close_interactive():
                self.echo("ended the interactive tasks of the previous cluster")
            busy = self.running_runs()
            if busy:
                raise UsageError(
                    "tasks of the current cluster are still running ("
                    + ", ".join(str(r.task) for r in busy)
                    + "); end them first (%killbgscripts or %waitworkers)"
                )
            launcher = create_backend(name, options)
            new = None
            try:
                new = Cluster(workers=workers, chief=chief, ps=ps, evaluator=evaluator,
                              placement=launcher.place(tasks, port_range()), kind=name,
                              remote=launcher.remote)
                if gpus_per_task:
                    new.gpus = assign({t: new.host_of(t) for t in tasks}, launcher.host_gpus(),
                                      gpus_per_task)
            except BaseException:
                if new is not None:
                    new.close()  # gives back the ports the backend held for it
                launcher.close()
                raise
            if self.cluster is not None:
                self.cluster.close()
            if self.launcher is not None:
                self.launcher.close()
                self._launchers.remove(self.launcher)
            self.cluster, self.launcher = new, launcher
            self._launchers.append(launcher)
            self._cluster_from = len(self.history)
            self.runs = {}
            self.job = None
            return new

    def ensure_cluster(self) -> Cluster:
        if self.cluster is None:
            return self.define_cluster(workers=2)
        return self.cluster

    @property
    def _cluster(self) -> Cluster:
        """The current cluster, for what needs one (a launch makes one first)."""
        if self.cluster is None:
            raise UsageError("no cluster is defined (%cluster N or define_cluster defines one)")
        return self.cluster

    @property
    def _launcher(self) -> Launcher:
        """The current cluster's backend, for what starts tasks (None once closed)."""
        if self.launcher is None:
            raise UsageError("this runtime was closed; use a new one (mwhelpers.runtime() "
                             "makes one)")
        return self.launcher

    # -- runs and their logs ---------------------------------------------------
    def get_run(self, task: TaskSpec) -> TaskRun:
        """The latest run of ``task`` (``'worker:0'``, ``1``...)."""
        t = self._resolve(task)
        run = self.runs.get(t)
        if run is None:
            raise UsageError(f"{t} has not been launched; %workers shows the tasks")
        return run

    def log_lines(self, task: TaskSpec) -> list[str]:
        """Every line of the log of ``task``'s latest run."""
        return self.get_run(task).lines()

    def results(self, tag: str = results.TAG) -> results.Results:
        """The last ``RESULT {...}`` line of each task's latest run, parsed: a dict of
        task name -> values, shown as a table (see :mod:`mwhelpers.results`).  Tasks
        that printed none are listed in ``.missing``."""
        if not self.runs:
            raise UsageError("no task has been launched yet, so there is no result")
        return results.Results.collect(((task, run.lines()) for task, run in sorted(self.runs.items())), tag)

    # -- launching -----------------------------------------------------------
    def launch(self, task: TaskSpec = "worker:0", *, code: str | None = None,
               script: str | os.PathLike[str] | None = None, args: Sequence[str] = (),
               background: bool = False, timeout: float | str | None = None,
               log: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | Sequence[str] | None = None, ready: str = "auto",
               stall_fix: bool | None = None, keras_fix: bool | None = None,
               verbose: bool | None = None) -> TaskRun:
        """Run a task's program: ``code`` (a string) or ``script`` (a .py file).

        Foreground (default): follow its output into the caller, each line
        prefixed with the task, until it ends; raise :class:`WorkerFailed`
        on a non-zero exit and :class:`WorkerTimeout` after ``timeout`` s.

        ``background=True``: return once the task is ready (its port accepts
        connections; ``ready='start'``: once it is started) or has ended.
        ``timeout`` then bounds the wait for readiness.

        ``stall_fix=False`` keeps tf.data autotuning in a MultiWorkerMirroredStrategy
        worker (see :mod:`mwhelpers.tfdata`); the default is ``self.stall_fix``.

        ``keras_fix=False`` runs Keras 3 unmended under multi-worker
        MultiWorkerMirroredStrategy (see :mod:`mwhelpers.kerasfix`,
        keras-team/keras#20585); the default is ``self.keras_fix``.

        ``verbose=True`` streams every line of the output, TensorFlow's
        informational C++ lines included (the default, ``self.verbose``, hides
        them from the caller; the log file keeps everything).
        """
        request = LaunchRequest.parse(task, code=code, script=script, args=args,
                                      background=background, timeout=timeout, log=log, env=env,
                                      ready=ready, stall_fix=stall_fix, keras_fix=keras_fix,
                                      verbose=verbose)
        return self.start(request)

    def launch_all(self, *, code: str | None = None,
                   script: str | os.PathLike[str] | None = None, args: Sequence[str] = (),
                   tasks: Iterable[TaskSpec] | None = None, background: bool = False,
                   timeout: float | str | None = None,
                   env: Mapping[str, str] | Sequence[str] | None = None, ready: str = "auto",
                   stall_fix: bool | None = None, keras_fix: bool | None = None,
                   verbose: bool | None = None) -> list[TaskRun]:
        """Run the same program as every task of the cluster (or as ``tasks``), all started
        at once: their TensorFlow imports and start-ups overlap instead of following each
        other.  Every task is checked first; when one cannot start, none does.

        Foreground (default): their output streams into the caller, each line prefixed
        with its task, until all have ended (parameter servers are not waited for); a
        failure raises :class:`WorkerFailed` once the others have had 30 s to follow it.
        ``background=True``: return once every task is ready (see :meth:`launch`); when
        one fails or times out first, the others of this launch are ended.  The options
        are :meth:`launch`'s; each task writes its own log, so there is no ``log``.
        Returns the runs, in the cluster's order.
        """
        with self._lock:
            created = self.cluster is None
            cluster = self.ensure_cluster()
        try:
            chosen = cluster.tasks if tasks is None else [cluster.check_task(t) for t in tasks]
            if not chosen:
                raise UsageError("launch_all needs at least one task; tasks=[] names none")
            requests = [LaunchRequest.parse(t, code=code, script=script, args=args,
                                            background=background, timeout=timeout, env=env,
                                            ready=ready, stall_fix=stall_fix,
                                            keras_fix=keras_fix, verbose=verbose)
                        for t in chosen]
            return self.start_all(requests)
        except UsageError:
            if created:  # nothing was started in it: as if no launch was asked for
                cluster.close()
                self.cluster = None
            raise

    def start_all(self, requests: Sequence[LaunchRequest]) -> list[TaskRun]:
        """Launch checked :class:`LaunchRequest` s together (see :meth:`launch_all`); they
        must agree on ``background``, ``timeout`` and ``verbose``."""
        if len({(r.background, r.timeout, r.verbose) for r in requests}) > 1:
            raise UsageError("tasks started together share background, timeout and verbose")
        with self._lock:
            self.checked_tasks(requests)
            job = self._interactive_job()
            runs = job.start(requests)
        first = requests[0]
        if first.background:
            try:
                for run in runs:
                    self._await_ready(run, first.timeout, job)
            except BaseException:
                job.end([r for r in runs if r.running], "now",
                        "ended by mwhelpers: a task started with it failed before it was ready")
                raise
        else:
            verbose = self.verbose if first.verbose is None else first.verbose
            job.wait(first.timeout, runs=runs, stream=True, quiet=not verbose)
        return runs

    def new_job(self, attempt: int = 1, supervised: bool = False) -> Job:
        """A new :class:`~mwhelpers.job.Job` for ``attempt`` of the current cluster's tasks;
        it becomes the runtime's current job (``self.job``)."""
        self.job = Job(self, attempt)
        self.job.supervised = supervised
        return self.job

    def _job(self) -> Job:
        """The current job, the one watches, signals and ends go through (attempt 1 of the
        cluster's tasks when none was made yet)."""
        return self.job if self.job is not None else self.new_job(1)

    def _interactive_job(self) -> Job:
        """The job that tasks launched one by one join: attempt 1, until a cluster is
        defined again or a supervised run made its own."""
        if self.job is None or self.job.supervised:
            return self.new_job(1)
        return self.job

    def start(self, request: LaunchRequest) -> TaskRun:
        """Launch a checked :class:`LaunchRequest` (see :meth:`launch`)."""
        with self._lock:
            created = self.cluster is None
            cluster = self.ensure_cluster()
            try:
                self.checked_tasks([request])
            except UsageError:
                if created:
                    cluster.close()
                    self.cluster = None
                raise
            job = self._interactive_job()
            run = job.start([request])[0]
        if request.background:
            self._await_ready(run, request.timeout, job)
        else:
            verbose = self.verbose if request.verbose is None else request.verbose
            job.watch([run], request.timeout, stream=True, quiet=not verbose)
            job.raise_failures([run])
        return run

    def checked_tasks(self, requests: Sequence[LaunchRequest], look: bool = True) -> list[Task]:
        """The tasks of ``requests``, once each is known to be in the cluster, not running,
        (here) its port free, and given once; with ``look``, the program of each looked at
        before launch (warnings only, once per program text)."""
        tasks = [self._checked_task(r) for r in requests]
        twice = sorted({str(t) for t in tasks if tasks.count(t) > 1})
        if twice:
            raise UsageError(f"{', '.join(twice)} given more than once; start each task once")
        for task, request in zip(tasks, requests, strict=True):
            if look:
                self._look_before_launch(task, request)
        return tasks

    def _checked_task(self, request: LaunchRequest) -> Task:
        """``request``'s task, once it is known to be in the cluster, not running, and (here)
        its port free."""
        task = self._cluster.check_task(request.task)
        self._check_not_running(task)
        if task.type in SERVER_JOBS and not self._cluster.remote:
            self._check_port_free(task)
        return task

    def _look_before_launch(self, task: Task, request: LaunchRequest) -> None:
        """Warn, never refuse, about the mistakes that can be seen in the program's source
        (:mod:`mwhelpers.precheck`); each warning once per program text."""
        if request.code is not None:
            source, path, folders = request.code, "cell.py", [os.getcwd()]
        else:
            script = request.script
            assert script is not None  # a request holds code or a script (LaunchRequest.parse)
            try:
                source = script.read_text(encoding="utf-8", errors="replace")
            except OSError:
                return
            path, folders = str(script), [str(script.parent)]
        same_python = self._launcher.python == sys.executable
        keras_version, tf_version = (installed("keras"), installed("tensorflow")) \
            if same_python else (None, None)
        env = {**os.environ, **request.env}
        keras_fix = self.keras_fix if request.keras_fix is None else request.keras_fix
        if KERAS_FIX_ENV in request.env:
            keras_fix = settings.get("MWHELPERS_KERAS_FIX", request.env)
        try:
            warnings = check(source, path, env, keras_version, tf_version, folders,
                             cell=request.code is not None, keras_fix=keras_fix)
        except Exception as e:  # a look that fails must not stop the launch
            warnings = [f"the program could not be looked at before its launch "
                        f"({type(e).__name__}: {e}); it runs all the same"]
        for warning in warnings:
            key = (hash(source), warning)
            if key not in self._warned:
                self._warned.add(key)
                self.echo(f"[mwhelpers] warning: {warning}")

    def _check_not_running(self, task: Task) -> None:
        run = self.runs.get(task)
        if run is not None and run.running:
            raise UsageError(
                f"{task} is already running (pid {run.pid}, for {run.uptime:.0f} s); "
                f"wait for it (%waitworkers) or end it (%killworker {task}) first"
            )

    def _check_port_free(self, task: Task) -> None:
        port = self._cluster.port(task)
        if port_in_use(port):
            raise UsageError(
                f"port {port} of {task} is already taken by {holder_of(port)}; end that "
                "process, or define the cluster again (%cluster) to get new ports"
            )

    def _log_path(self, task: Task, log: Path | None) -> Path:
        if log:
            return log
        n = self._launch_counts.get(task, 0) + 1
        self._launch_counts[task] = n
        suffix = "" if n == 1 else f".run{n}"
        return self.log_dir / f"{task.slug}{suffix}.log"

    def child_env(self, task: Task, extra: Mapping[str, str] | None = None,
                  stall_fix: bool | None = None, attempt: int = 1,
                  base: Mapping[str, str] | None = None,
                  keras_fix: bool | None = None) -> dict[str, str]:
        """The environment a task's program gets: ``base`` (default: the kernel's
        whole environment), TF_CONFIG and mwhelpers' variables, then ``extra``; and gRPC's
        first reconnect back-off (see :func:`fast_reconnect`)."""
        env = dict(os.environ if base is None else base)
        # The kernel's inline plotting backend means nothing in a worker.
        if "inline" in os.environ.get("MPLBACKEND", ""):
            env["MPLBACKEND"] = "Agg"
        cluster = self._cluster
        env["TF_CONFIG"] = cluster.tf_config(task)
        if cluster.gpus is not None:  # its own GPUs (a --env given at launch still wins)
            # (none for a task that the cluster's GPU map leaves out, as its table says)
            env["CUDA_VISIBLE_DEVICES"] = cluster.gpus_of(task) or ""
        env["MWHELPERS_TASK"] = str(task)
        env["MWHELPERS_ATTEMPT"] = str(attempt)
        env[STALL_FIX_ENV] = "1" if (self.stall_fix if stall_fix is None else stall_fix) else "0"
        env[KERAS_FIX_ENV] = "1" if (self.keras_fix if keras_fix is None else keras_fix) else "0"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        env.update(fast_reconnect(env, self.reconnect_ms))
        return env

    def spawn(self, task: Task, request: LaunchRequest, attempt: int,
              standby: Standby | None = None) -> TaskRun:
        """Start one task's process (a :class:`~mwhelpers.job.Job` calls this) and record
        its run: ``standby``'s process, released, when it was started ahead for this and
        still runs; a new one otherwise."""
        if standby is not None and standby.process.running:
            try:
                standby.process.release()
            except OSError:  # it died at this very moment: as below
                pass
            else:
                return self._record(task, standby.process, standby.spec, standby.ready, attempt)
        if standby is not None:  # it died waiting: a cold start, under the number it had
            self._launch_counts[task] = standby.number - 1
            standby.replaced = True
        spec, ready = self._spec(task, request, attempt)
        return self._record(task, self._launcher.start(spec), spec, ready, attempt)

    def spawn_standby(self, task: Task, request: LaunchRequest, attempt: int) -> Standby | None:
        """Start ``task``'s process for ``attempt`` ahead (None where the backend cannot):
        TensorFlow imported, it waits until :meth:`spawn` releases it.  Not a run until then;
        :meth:`discard_standby` ends one that is not needed."""
        if not self._launcher.standby or request.log:  # a log of its own would be truncated
            return None
        spec, ready = self._spec(task, request, attempt, standby=True)
        number = self._launch_counts[task]
        try:
            process = self._launcher.start(spec)
        except BaseException:  # its launch number goes back to the task's next launch
            self._launch_counts[task] = number - 1
            raise
        return Standby(task, process, spec, ready, attempt, number)

    def discard_standby(self, standby: Standby) -> None:
        """End a standby that no restart needed, remove its log, and give its launch number
        back (the next launch of its task gets it); one a cold start replaced keeps both."""
        if standby.process.running:
            standby.process.end(proctree.ESCALATIONS["now"], str(standby.task))
        if standby.replaced:
            return
        if self._launch_counts.get(standby.task) == standby.number:
            self._launch_counts[standby.task] = standby.number - 1
        standby.spec.log_path.unlink(missing_ok=True)  # the kernel writes every task's log

    def _spec(self, task: Task, request: LaunchRequest, attempt: int,
              standby: bool = False) -> tuple[LaunchSpec, str]:
        """What starts ``task`` for ``request`` in ``attempt``, and its readiness mode."""
        cluster, launcher = self._cluster, self._launcher
        log_path = self._log_path(task, request.log)
        if request.code is not None:
            script = self.log_dir / f"{task.slug}_cell.py"
            # Written beside and renamed over: a run of the task that reads its earlier copy
            # now (a standby released a moment ago) gets all of one or all of the other.
            partial = script.with_name(f".{script.name}.{os.getpid()}.{threading.get_ident()}")
            partial.write_text(request.code)
            os.replace(partial, script)
        else:
            assert request.script is not None  # a request holds code or a script
            script = request.script
        ready = request.ready
        if ready == "auto":
            ready = "port" if task.type in SERVER_JOBS else "start"
        # The backend says what a task's environment starts from (another machine gets the
        # variables that matter, not the kernel's whole environment) and fills in its folder.
        base = launcher.task_env(os.environ)
        spec = LaunchSpec(script=str(Path(script).resolve()), args=list(request.args),
                          env=self.child_env(task, request.env, request.stall_fix, attempt, base,
                                             request.keras_fix),
                          log_path=Path(log_path), cell=request.code is not None,
                          host=cluster.host_of(task), port=cluster.port(task), standby=standby)
        return spec, ready

    def _record(self, task: Task, process: Process, spec: LaunchSpec, ready: str,
                attempt: int) -> TaskRun:
        """The run of ``process``, started from ``spec``: recorded as the task's latest."""
        cluster = self._cluster
        run = TaskRun(task, process, spec.log_path, cluster.port(task),
                      cluster.address(task), ready, spec.script, attempt=attempt,
                      cwd=spec.cwd, host=spec.host, cell=spec.cell)
        if cluster.gpus is not None:
            run.gpus = spec.env.get("CUDA_VISIBLE_DEVICES", "")
        run.keras_fix = settings.get("MWHELPERS_KERAS_FIX", spec.env)
        self.runs[task] = run
        self.history.append(run)
        return run

    # -- readiness and following ----------------------------------------------
    def probe(self, run: TaskRun) -> bool:
        """True once ``run``'s server accepts connections where TF_CONFIG says it is."""
        return port_accepts(run.port, self._cluster.connect_address(run.task))

    def _await_ready(self, run: TaskRun, timeout: float | None, job: Job,
                     default_timeout: float = 120.0) -> TaskRun:
        timeout = default_timeout if timeout is None else timeout
        if run.ready_mode == "start":
            run.mark_ready()
            self.echo(f"[{run.task}] started in the background (pid {run.pid}); log: {run.log_path}")
            return run
        self.echo(
            f"[{run.task}] starting in the background (pid {run.pid}); waiting until "
            f"{run.address} accepts connections ... log: {run.log_path}"
        )
        how = await_ready(run, self.probe, run.started + timeout)
        if how == "ready":
            self.echo(f"[{run.task}] ready after {run.ready_after:.2f} s (port {run.port} is open)")
        elif how == "ended":
            if run.failed:
                job.raise_failures([run])
            self.echo(f"[{run.task}] ended with exit code 0 before it opened port {run.port}")
        else:
            job.end([run], "stuck", f"ended by mwhelpers: it did not become ready within "
                    f"{timeout:g} s")
            raise not_ready_error(run, timeout, self._cluster.host_of(run.task))
        return run

    def watch(self, runs: Iterable[TaskRun], timeout: float | None = None, *,
              stream: bool = False, quiet: bool | None = None,
              on_line: Callable[[TaskRun, str], None] | None = None,
              until: Callable[[], bool] | None = None, what: str = "did not finish",
              end_on_interrupt: bool = True) -> str:
        """Follow ``runs`` until all have ended (returns ``"ended"``) or ``until()`` is
        true (``"until"``), with a :class:`~mwhelpers.watcher.Watcher`.

        ``stream``: echo their new lines with a task prefix (without TensorFlow's
        informational lines unless ``quiet`` is False; default: ``not self.verbose``).
        ``on_line(run, line)`` is called for each line.  After ``timeout`` seconds the
        runs still running have their stacks dumped, are ended, and WorkerTimeout is
        raised (saying they ``what`` within it).  On an interrupt (Ctrl-C, the
        notebook's stop button) the runs are ended, unless ``end_on_interrupt`` is
        False, and the interrupt is raised again.
        """
        return self._job().watch(
            runs, timeout, stream=stream, quiet=quiet, on_line=on_line, until=until, what=what,
            end_on_interrupt=end_on_interrupt)

    def not_ready_tasks(self) -> list[tuple[Task, str]]:
        """(task, reason) for each chief/worker task that never became ready."""
        out: list[tuple[Task, str]] = []
        if self.cluster is None:
            return out
        for task in self.cluster.tasks:
            if task.type not in TRAINING_JOBS:
                continue
            run = self.runs.get(task)
            if run is None:
                out.append((task, "never launched"))
            elif run.ready_after is None and run.returncode != 0:
                out.append((task, f"{run.outcome()} before its port opened" if not run.running
                            else f"running, but port {run.port} never opened"))
        return out

    # -- ending ----------------------------------------------------------------
    def latest_runs(self) -> list[TaskRun]:
        """The latest run of each task of the current cluster."""
        return list(self.runs.values())

    def end(self, runs: Iterable[TaskRun], why: str, policy: str = "now") -> list[str]:
        """End the process trees of ``runs`` that still run through the escalation
        ``policy`` names (see :class:`~mwhelpers.job.Job`), noting ``why`` in their
        outcome; returns what ended (see :meth:`end_all`)."""
        return self._job().end(list(runs), policy, why)

    def kill(self, task: TaskSpec, sig: int | str = signal.SIGKILL, wait: bool = True,
             why: str | None = None) -> TaskRun:
        """Send ``sig`` to a task's whole process tree (fault injection).

        Returns the TaskRun.  With SIGKILL and ``wait``, returns once every
        process of the tree is gone.  ``why`` is recorded in the task's
        outcome (default: "<SIG> sent on request").
        """
        sig = proctree.parse_signal(sig)
        with self._lock:
            if self.cluster is None:
                raise UsageError("no cluster is defined and no task was launched")
            run = self.get_run(task)
            return self._job().signal(run, sig, why or f"{sig.name} sent on request", wait)

    def wait_for_line(self, task: TaskSpec, pattern: str,
                      timeout: float | str | None = 120.0) -> str:
        """Wait until ``task``'s log has a line matching the regular expression ``pattern``
        (a line already there counts) and return that line; the task goes on running.

        Raises UsageError when the task was never launched, or ended without such a line
        (saying how it ended), and WorkerTimeout after ``timeout`` seconds, which ends the
        task, as any watch that times out does.  Instead of polling ``run.lines()`` in a loop.
        """
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise UsageError(f"{pattern!r} is not a valid regular expression: {e}") from None
        run = self.runs.get(self._resolve(task))
        if run is None:
            raise UsageError(f"{self._resolve(task)} was not launched; launch it with --bg first")
        found = [ln for ln in run.lines() if regex.search(ln)][:1]
        if found:
            return found[0]
        if not run.running:
            raise UsageError(f"{run.task} ended ({run.outcome()}) without logging {pattern!r}")

        def on_line(r: TaskRun, line: str) -> None:
            if not found and regex.search(line):
                found.append(line)

        self.watch([run], parse_timeout(timeout), on_line=on_line, until=lambda: bool(found),
                   what=f"never logged {pattern!r}")
        if not found:
            raise UsageError(f"{run.task} ended ({run.outcome()}) before logging {pattern!r}")
        return found[0]

    def kill_when(self, task: TaskSpec, pattern: str, sig: int | str = signal.SIGKILL,
                  timeout: float = 300.0) -> str:
        """Wait until ``task``'s log has a line matching ``pattern``, then kill it.

        Deterministic fault injection: kill worker 1 right after it logs,
        say, ``Epoch 2/``.  Returns the matching line.
        """
        sig = proctree.parse_signal(sig)
        run = self.runs.get(self._resolve(task))
        if run is None or not run.running:
            raise UsageError(f"{self._resolve(task)} is not running; launch it with --bg first")
        line = self.wait_for_line(task, pattern, timeout)
        self.kill(run.task, sig, why=f"{sig.name} sent when its log matched {pattern!r}")
        return line

    def wait(self, timeout: float | str | None = None,
             grace_after_failure: float = 30.0) -> list[TaskRun]:
        """Wait for every background task to end.

        Parameter servers never end by themselves and are not waited for.
        When a task fails, the others get ``grace_after_failure`` s to end
        by themselves (a synchronous job's workers follow their failed peer)
        and are then ended.  Raises WorkerFailed naming the first task to
        die (the root cause) and the rest in the order they died, or
        WorkerTimeout.
        """
        waiting = [r for r in self.runs.values() if r.task.type != "ps" and r.running]
        for t, why in self.not_ready_tasks():
            if why == "never launched" and waiting:
                self.echo(f"note: {t} was never launched from this kernel; its peers wait for it")
        return self._job().wait(timeout, grace_after_failure)

    def failures(self, runs: Iterable[TaskRun] | None = None,
                 restartable_exit_codes: Iterable[int] = ()) -> list[Failure]:
        """Failure records of the failed runs (default: the latest of each task),
        the first to die first."""
        runs = list(self.runs.values() if runs is None else runs)
        return self._job().failures(runs, restartable_exit_codes)

    def end_all(self, extra: Iterable[psutil.Process] = (), policy: str = "gentle",
                extra_pids: Iterable[int] = ()) -> list[str]:
        """End every task tree, plus ``extra`` psutil processes, the process trees
        of ``extra_pids``, and escaped orphans of this session, through the escalation
        ``policy`` names (default ``"gentle"``: SIGINT, SIGTERM, SIGKILL).  Returns a list
        of lines saying what ended."""
        extra = list(extra) + [p for pid in extra_pids for p in proctree.tree(pid)]
        with self._lock:
            lines = self._job().end(self.running_runs(), policy, "ended by %killbgscripts",
                                    extra=extra + self.escaped_orphans())
            if self._close_interactive():
                lines.append("ended ipyparallel's controller of the interactive tasks")
            return lines

    # -- interactive tasks -----------------------------------------------------
    def interactive(self, timeout: float | str = 60) -> Interactive:
        """Every task of the current cluster as a live Python (an ipyparallel engine with its
        own TF_CONFIG), started on first use: see :mod:`mwhelpers.interactive`.  ``timeout``
        bounds the wait for the engines to connect."""
        current = self._interactive
        if current is not None and not current.closed and current.cluster is self.cluster:
            return current
        from .interactive import Interactive  # ipyparallel only when it is used
        self.ensure_cluster()
        self._interactive = Interactive(self, parse_timeout(timeout) or 60)
        return self._interactive

    def _close_interactive(self) -> bool:
        """End the interactive tasks and their controller; whether there were any."""
        current, self._interactive = self._interactive, None
        if current is None or current.closed:
            return False
        current.close()
        return True

    def escaped_orphans(self) -> list[psutil.Process]:
        """Processes that a task or a ``%%script --bg`` cell of this session started
        and that lost their parent.

        Every process started from here carries our session mark in its
        environment; one whose parent is gone has been re-parented away from
        us (the ``python main.py`` that IPython's own %killbgscripts leaves
        behind when it kills ``bash``).  Only those that also carry a task's
        mark (``MWHELPERS_TASK``) or a background cell's (``MWHELPERS_BG``)
        count: a ``!nohup tensorboard ... &`` of the user's is not ours to end.
        """
        me = os.getpid()
        mine = {p.pid for p in proctree.tree(me)}
        try:
            mine |= {p.pid for p in psutil.Process(me).parents()}
        except psutil.Error:
            pass
        return proctree.carrying(
            SESSION_ENV, self.session, exclude=mine,
            where=lambda env: "MWHELPERS_TASK" in env or env.get(BG_ENV) == self.session)

    # -- reporting -----------------------------------------------------------
    def status(self) -> StatusTable:
        return StatusTable(self.runs.values())

    def timeline(self, runs: Iterable[TaskRun] | None = None) -> Timeline:
        """Every run of the current cluster (each attempt of a supervised job too) on one
        time axis: launched, ready, Keras epochs or ``step N`` lines from the logs,
        signals sent, exits.  A picture in JupyterLab; ``.save(path)`` writes a PNG;
        ``print()`` gives it as text.  See :mod:`mwhelpers.timeline`."""
        runs = self.history[self._cluster_from:] if runs is None else list(runs)
        return Timeline(runs)

    def log(self, task: TaskSpec | None = None, n: int = 20, grep: str | None = None) -> list[str]:
        """The last ``n`` lines of one task's log, or of all, prefixed with the task;
        with ``grep``, the last ``n`` lines that match that regular expression."""
        if task is None or task == "":
            runs = list(self.runs.values())
            if not runs:
                raise UsageError("no task has been launched yet, so there is no log")
        else:
            runs = [self.get_run(task)]
        if grep is None:
            return [f"[{r.task}] {ln}" for r in runs for ln in r.tail(n)]
        try:
            pattern = re.compile(grep)
        except re.error as err:
            raise UsageError(f"--grep {grep!r} is not a regular expression: {err}") from None
        out: list[str] = []
        for r in runs:
            matching = [ln for ln in r.lines() if pattern.search(ln)]
            out += [f"[{r.task}] {ln}" for ln in (matching[-n:] if n else matching)]
        return out

    def follow(self, task: TaskSpec, timeout: float | str | None = None) -> TaskRun:
        """Stream one task's log into the caller until it ends."""
        run = self.get_run(task)
        timeout = parse_timeout(timeout)
        until = None if timeout is None else time.monotonic() + timeout
        try:
            self.watch([run], stream=True, quiet=False, end_on_interrupt=False,
                       until=lambda: until is not None and time.monotonic() > until)
        except KeyboardInterrupt:
            self.echo(f"stopped following {run.task}; it is still {run.state}")
        return run

    # -- supervision -------------------------------------------------------------
    # Run the cluster's tasks together and restart them all after a fault: one function,
    # rt.supervise(...) being supervisor.supervise(rt, ...).
    supervise = supervisor.supervise


def _close_launchers(launchers: list[Launcher]) -> None:
    for launcher in list(launchers):
        launcher.close()


_RUNTIME: Runtime | None = None


def runtime() -> Runtime:
    """The process-wide Runtime (created on first use, and again after close())."""
    global _RUNTIME
    if _RUNTIME is None or _RUNTIME.closed:
        _RUNTIME = Runtime()
    return _RUNTIME


__all__ = ["Runtime", "runtime", "TaskRun", "StatusTable", "LogFollower", "port_accepts"]
