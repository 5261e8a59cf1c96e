"""The worker runtime: the user's API to launch, watch, wait for, kill and supervise the
task processes of a cluster, and to read their reports.

One :class:`Runtime` per kernel (``mwhelpers.runtime()`` returns it); the magics are a thin
layer over its public methods, and scripts can use it directly, best as a context manager
(``with Runtime() as rt: ...``) so that its processes and its guard pipe are released when
done.

It only orchestrates.  What it hands work to, one module each: :mod:`.spawner` (a launch's
checks, each task's spec, environment and log, its start: a
:class:`~mwhelpers.spawner.Spawner` per cluster), :mod:`.job` (the runs of an attempt,
watched, waited for and ended; :class:`~mwhelpers.job.Jobs`, the only record of runs),
:mod:`.supervisor` (restarts on faults), :mod:`.session` (the session mark and escaped
processes), and the reports (:mod:`.status`, :mod:`.timeline`, :mod:`.results`).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

from . import proctree, results, settings, supervisor
from .backends.base import Launcher
from .cluster import Cluster, Task, parse_task
from .errors import UsageError
from .interactive import Interactive
from .job import Jobs, end_runs
from .launchoptions import LaunchOptions
from .logs import LogFollower
from .precheck import Lookout
from .proctree import Policy
from .services import Services
from .session import claim_session, escaped_orphans
from .spawner import LogNames, Spawner, TaskDefaults, open_cluster, port_accepts
from .status import StatusTable
from .taskrun import LaunchRequest, TaskRun, parse_timeout
from .timeline import Timeline
from .watcher import CellLimits

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a dependency there (pyproject.toml)
    from typing_extensions import Unpack

TaskSpec = str | int | Task  # "worker:1", 1 (worker:1), "chief", Task("worker", 1)


def _print(line: str) -> None:
    print(line, flush=True)


def default_log_dir(session_name: str | None = None) -> Path:
    setting = settings.LOG_DIR.read()
    root = Path(setting) if setting else Path.cwd() / "worker_logs"
    name = session_name or os.environ.get("JPY_SESSION_NAME") or "kernel"
    stem = Path(name).stem or "kernel"
    return root / f"{stem}-{os.getpid()}"


class Runtime:
    """Launches and tracks the task processes of one kernel (or script).

    Its attributes, and what each promises: ``cluster`` (the current :class:`Cluster`, or
    None); ``launcher`` (that cluster's backend: read it, never start or close tasks through
    it; it is closed when a cluster is defined again); ``jobs`` (the record of every attempt's
    runs: ``current()``, the job that watches, signals and ends go through, ``latest()``,
    ``history()`` and ``not_ready()``; only the runtime and the supervisor make jobs, ``new()``,
    or change the cluster, ``use()``); ``defaults``, ``verbose`` and ``cell_limits`` (settings
    the user may change); ``services`` (what it owns and ends with it); ``session`` (its mark);
    ``engines`` (the interactive tasks' engines, once started).
    """

    # Run the cluster's tasks together and restart them all after a fault: one function,
    # rt.supervise(...) being supervisor.supervise(rt, ...).
    supervise = supervisor.supervise

    def __init__(self, log_dir: str | os.PathLike[str] | None = None,
                 echo: Callable[[str], None] = _print) -> None:
        self._log_dir = Path(log_dir) if log_dir else None
        self.echo = echo
        self.cluster: Cluster | None = None
        self.launcher: Launcher | None = None  # the current cluster's backend (mwhelpers.backends)
        # What every task gets unless its launch says otherwise (stall_fix, keras_fix,
        # reconnect_ms: mwhelpers.spawner.TaskDefaults), read at each launch.
        self.defaults = TaskDefaults()
        # Cells show a task's output without TF's informational C++ lines (logs keep them).
        self.verbose = False
        # What it owns and closes with it: the follower of its runs' logs, the cell limits,
        # the warm-start servers of its local launchers (mwhelpers.services).
        self.services = Services()
        # How much of a task's output a cell shows (mwhelpers.watcher.CellLimits): this
        # runtime's own (rt.cell_limits.head = 1000, say).
        self.cell_limits: CellLimits = self.services.cell_limits
        self.jobs = Jobs(self)  # every attempt's runs (mwhelpers.job)
        self.session = claim_session()
        self._names = LogNames(lambda: self.log_dir)
        self._lookout = Lookout(echo)  # the look before launch, each warning said once
        self._lock = threading.RLock()
        # The notebook's name, which the default log folder is named after (%load_ext sets it).
        self.session_name: str | None = None
        # The ipyparallel engines of the current cluster's tasks, once asked for
        # (mwhelpers.interactive; started by interactive()).
        self.engines: Interactive | None = None
        self._launchers: list[Launcher] = []  # the current one, for the finalizer
        # At exit (or when this object is collected) the launchers end what still runs, then
        # its services end.
        self._finalizer = weakref.finalize(self, _close_launchers, self._launchers, self.services)

    # -- life cycle ------------------------------------------------------------
    def close(self) -> None:
        """End every task, give the cluster's ports back and release the launcher."""
        if not self._finalizer.alive:
            return
        with self._lock:
            _close(self.engines)
            self.engines = None
            end_runs([r for r in self.runs.values() if r.running],
                     "ended when the runtime was closed")
            if self.cluster is not None:
                self.cluster.close()
        self._finalizer()
        self.launcher = None
        self.jobs.use(None)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def log_dir(self) -> Path:
        """The folder of this runtime's logs (made on first use): ``MWHELPERS_LOG_DIR`` or
        ``./worker_logs``, then one folder per notebook and kernel."""
        if self._log_dir is None:
            self._log_dir = default_log_dir(self.session_name)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir

    @log_dir.setter
    def log_dir(self, value: str | os.PathLike[str] | None) -> None:
        self._log_dir = Path(value) if value else None

    # -- cluster -------------------------------------------------------------
    def define_cluster(self, workers: int = 2, chief: bool = False, ps: int = 0,
                       evaluator: bool = False, gpus_per_task: int | None = None,
                       backend: str | None = None, **options: object) -> Cluster:
        """Replace the current cluster (its ports are released, its backend closed).

        ``backend`` names how the tasks are started (:mod:`mwhelpers.backends`):
        ``"local"`` (this machine), ``"ssh"``, ``"slurm"`` or one a package
        registered; the other keyword arguments are that backend's options, checked
        against what it declares (``%cluster --backend NAME --help`` lists them).
        Without ``backend``: the one backend that takes every option given, so
        ``hosts=["node1", "me@node2"]`` means ``ssh`` (tasks placed over these hosts in
        turn, TF_CONFIG naming the address each host was reached at) and ``job=ID``
        means ``slurm`` (the nodes of that allocation), ``address=HOST:PORT`` means ``ray``
        (the nodes of that Ray cluster; ``"local"``: a private one here); no option means ``local``
        (``host=`` names the address TF_CONFIG gives, default localhost).
        ``gpus_per_task=K``: each task gets K GPUs of its host of its own, as
        ``CUDA_VISIBLE_DEVICES`` (see :mod:`mwhelpers.gpus`); UsageError when a host has
        too few.  A host that cannot be used raises
        :class:`~mwhelpers.errors.InfrastructureError`.
        """
        with self._lock:
            if _close(self.engines):
                self.echo("ended the interactive tasks of the previous cluster")
            self.engines = None
            busy = [r for r in self.runs.values() if r.running]
            if busy:
                raise UsageError(
                    "tasks of the current cluster are still running ("
                    + ", ".join(str(r.task) for r in busy)
                    + "); end them first (%killbgscripts or %waitworkers)")
            new, launcher = open_cluster(workers, chief, ps, evaluator, gpus_per_task, backend,
                                         options, self.services)
            self._drop_cluster()
            self.cluster, self.launcher = new, launcher
            for note in launcher.notes():
                self.echo(f"note: {note}")
            self._launchers.append(launcher)
            self.jobs.use(Spawner(new, launcher, self.defaults, self._names, self._lookout,
                                  self.services.follower))
            return new

    def _drop_cluster(self) -> None:
        """Give the current cluster's ports back and close its backend."""
        if self.cluster is not None:
            self.cluster.close()
        if self.launcher is not None:
            self.launcher.close()
            self._launchers.remove(self.launcher)
        self.cluster = self.launcher = None
        self.jobs.use(None)

    # -- runs and their logs ---------------------------------------------------
    @property
    def runs(self) -> dict[Task, TaskRun]:
        """The latest run of each task of the current cluster."""
        return self.jobs.latest()

    @property
    def history(self) -> list[TaskRun]:
        """Every run of this runtime, oldest first (each attempt of a supervised job too)."""
        return self.jobs.history()

    def get_run(self, task: TaskSpec) -> TaskRun:
        """The latest run of ``task`` (``'worker:0'``, ``1``...)."""
        t = self.cluster.check_task(task) if self.cluster else parse_task(task)
        run = self.runs.get(t)
        if run is None:
            raise UsageError(f"{t} has not been launched; %workers shows the tasks")
        return run

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
               **options: Unpack[LaunchOptions]) -> TaskRun:
        """Run a task's program: ``code`` (a string) or ``script`` (a .py file).

        Foreground (default): follow its output into the caller, each line prefixed with the
        task, until it ends; raise :class:`WorkerFailed` on a non-zero exit and
        :class:`WorkerTimeout` after ``timeout`` s.  ``background=True``: return once the
        task is ready (its port accepts connections; ``ready='start'``: once it is started)
        or has ended; ``timeout`` then bounds the wait for readiness.

        The other options (:data:`~mwhelpers.launchoptions.LAUNCH_OPTIONS`): ``log``, a file
        of its own; ``env``, variables on top of the kernel's; ``stall_fix=False`` keeps
        tf.data autotuning in an MWMS worker (:mod:`mwhelpers.taskside.tfdata`);
        ``keras_fix=False`` runs Keras 3 unmended (:mod:`mwhelpers.taskside.kerasfix`,
        keras-team/keras#20585), both by default as ``self.defaults`` says; ``verbose=True``
        streams every line, TensorFlow's informational C++ lines too (by default, as
        ``self.verbose`` says, a cell leaves them out; the log keeps everything).
        """
        return self._launch([task], code, script, args, options)[0]

    def launch_all(self, *, code: str | None = None,
                   script: str | os.PathLike[str] | None = None, args: Sequence[str] = (),
                   tasks: Iterable[TaskSpec] | None = None,
                   **options: Unpack[LaunchOptions]) -> list[TaskRun]:
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
        if "log" in options:
            raise UsageError("launch_all starts several tasks, each with its own log: no log=")
        chosen = None if tasks is None else list(tasks)
        if chosen == []:
            raise UsageError("launch_all needs at least one task; tasks=[] names none")
        return self._launch(chosen, code, script, args, options)

    def _launch(self, tasks: list[TaskSpec] | None, code: str | None,
                script: str | os.PathLike[str] | None, args: Sequence[str],
                options: LaunchOptions) -> list[TaskRun]:
        """The launch pipeline: requests for ``tasks`` (None: every task), checked once by
        the job that starts them, spawned, then followed into the caller or until ready."""
        with self._lock:
            created = self.cluster is None
            cluster = self.cluster or self.define_cluster()
            try:
                requests = [LaunchRequest.parse(t, code=code, script=script, args=args, **options)
                            for t in (cluster.tasks if tasks is None else tasks)]
                job = self.jobs.for_launch()
                runs = job.start(requests)
            except UsageError:
                if created:  # nothing was started in it: as if no launch was asked for
                    self._drop_cluster()
                raise
        first = requests[0]
        if first.background:
            try:
                for run in runs:
                    job.await_ready(run, first.timeout)
            except BaseException:
                job.end([r for r in runs if r.running],
                        "ended by mwhelpers: a task started with it failed before it was ready")
                raise
        else:
            verbose = self.verbose if first.verbose is None else first.verbose
            job.wait(first.timeout, runs=runs, stream=True, quiet=not verbose)
        return runs

    # -- faults, waiting and ending ---------------------------------------------
    def kill(self, task: TaskSpec, sig: int | str = signal.SIGKILL, wait: bool = True,
             why: str | None = None) -> TaskRun:
        """Send ``sig`` to a task's whole process tree (fault injection); returns its run.
        With SIGKILL and ``wait``, returns once every process of the tree is gone.  ``why`` is
        noted in the task's outcome (default: "<SIG> sent on request")."""
        sig = proctree.parse_signal(sig)
        with self._lock:
            if self.cluster is None:
                raise UsageError("no cluster is defined and no task was launched")
            run = self.get_run(task)
            return self.jobs.current().signal(run, sig, why or f"{sig.name} sent on request", wait)

    def wait_for_line(self, task: TaskSpec, pattern: str,
                      timeout: float | str | None = 120.0) -> str:
        """Wait until ``task``'s log has a line matching the regular expression ``pattern``
        (a line already there counts) and return that line; the task goes on running.

        Raises UsageError when the task was never launched, or ended without such a line
        (saying how it ended), and WorkerTimeout after ``timeout`` seconds, which ends the
        task, as any watch that times out does.  Instead of polling ``run.lines()`` in a loop.
        """
        return self.jobs.current().wait_for_line(self.get_run(task), _regex(pattern),
                                                 parse_timeout(timeout))

    def kill_when(self, task: TaskSpec, pattern: str, sig: int | str = signal.SIGKILL,
                  timeout: float = 300.0) -> str:
        """Wait until ``task``'s log has a line matching ``pattern``, then kill it (fault
        injection at a known point: worker 1 right after it logs ``Epoch 2/``, say).  Returns
        the matching line."""
        sig = proctree.parse_signal(sig)
        run = self.get_run(task)
        if not run.running:
            raise UsageError(f"{run.task} is not running; launch it with --bg first")
        # (its log read every follow.URGENT meanwhile: the kill lands within a step or two)
        line = self.jobs.current().wait_for_line(run, _regex(pattern), parse_timeout(timeout),
                                                 urgent=True)
        self.kill(run.task, sig, why=f"{sig.name} sent when its log matched {pattern!r}")
        return line

    def wait(self, timeout: float | str | None = None,
             grace_after_failure: float = 30.0) -> list[TaskRun]:
        """Wait for every background task but the parameter servers (they never end by
        themselves) to end.  When a task fails, the others get ``grace_after_failure`` s to
        follow it (a synchronous job's workers do) and are then ended.  Raises WorkerFailed
        naming the first task to die (the root cause) and the rest in the order they died, or
        WorkerTimeout."""
        if any(r.task.type != "ps" and r.running for r in self.runs.values()):
            for t, why in self.jobs.not_ready():
                if why == "never launched":
                    self.echo(f"note: {t} was never launched from this kernel; its peers "
                              "wait for it")
        if self.cluster is None:
            return []
        return self.jobs.current().wait(timeout, grace_after_failure)

    def end_all(self, extra: Iterable[psutil.Process] = (), policy: Policy | str = Policy.GENTLE,
                extra_pids: Iterable[int] = ()) -> list[str]:
        """End every task tree, plus ``extra`` psutil processes, the process trees
        of ``extra_pids``, and escaped orphans of this session, through the escalation of
        ``policy`` (default ``GENTLE``: SIGINT, SIGTERM, SIGKILL).  Returns a list of lines
        saying what ended."""
        policy = Policy.parse(policy)
        extra = list(extra) + [p for pid in extra_pids for p in proctree.tree(pid)]
        with self._lock:
            lines = end_runs([r for r in self.runs.values() if r.running],
                             "ended by %killbgscripts", policy,
                             extra=extra + escaped_orphans(self.session))
            if _close(self.engines):
                self.engines = None
                lines.append("ended ipyparallel's controller of the interactive tasks")
            return lines

    # -- interactive tasks -----------------------------------------------------
    def interactive(self, timeout: float | str = 60) -> Interactive:
        """Every task of the current cluster as a live Python (an ipyparallel engine with its
        own TF_CONFIG), started on first use: see :mod:`mwhelpers.interactive`.  ``timeout``
        bounds the wait for the engines to connect."""
        current = self.engines
        if current is not None and not current.closed and current.cluster is self.cluster:
            return current
        cluster = self.cluster or self.define_cluster()
        self.engines = Interactive(self, cluster, parse_timeout(timeout) or 60)
        return self.engines

    # -- reporting -----------------------------------------------------------
    def status(self) -> StatusTable:
        """Each task's latest run: its state, pid, uptime and last line, as a table."""
        return StatusTable(self.runs.values())

    def timeline(self, runs: Iterable[TaskRun] | None = None) -> Timeline:
        """Every run of the current cluster (each attempt of a supervised job too) on one
        time axis: launched, ready, Keras epochs or ``step N`` lines from the logs,
        signals sent, exits.  A picture in JupyterLab; ``.save(path)`` writes a PNG;
        ``print()`` gives it as text.  See :mod:`mwhelpers.timeline`."""
        return Timeline(self.jobs.of_cluster() if runs is None else list(runs))

    def log(self, task: TaskSpec | None = None, n: int = 20, grep: str | None = None) -> list[str]:
        """The last ``n`` lines of one task's log, or of all, prefixed with the task;
        with ``grep``, the last ``n`` lines that match that regular expression."""
        if task is None or task == "":
            if not self.runs:
                raise UsageError("no task has been launched yet, so there is no log")
            return excerpt(self.runs.values(), n, grep)
        return excerpt([self.get_run(task)], n, grep)


def excerpt(runs: Iterable[TaskRun], n: int = 20, grep: str | None = None) -> list[str]:
    """The last ``n`` lines of each run's log, prefixed with its task; with ``grep``, the last
    ``n`` lines that match that regular expression (``n=0``: all)."""
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


def _close(engines: Interactive | None) -> bool:
    """End interactive tasks and their controller; whether there were any."""
    if engines is None or engines.closed:
        return False
    engines.close()
    return True


def _close_launchers(launchers: list[Launcher], services: Services) -> None:
    for launcher in list(launchers):
        launcher.close()
    services.close()


_RUNTIME: Runtime | None = None


def existing_runtime() -> Runtime | None:
    """The process-wide Runtime when one was made and is open (none is made here)."""
    return _RUNTIME if _RUNTIME is not None and _RUNTIME._finalizer.alive else None


def runtime() -> Runtime:
    """The process-wide Runtime (created on first use, and again after close())."""
    global _RUNTIME
    if _RUNTIME is None or not _RUNTIME._finalizer.alive:
        _RUNTIME = Runtime()
    return _RUNTIME


def set_runtime(rt: Runtime | None) -> Runtime | None:
    """Make ``rt`` the process-wide Runtime, the one the magics drive (None: the next
    :func:`runtime` makes a new one); returns the one it replaces, which stays open (a
    script or test that made its own closes it)."""
    global _RUNTIME
    previous, _RUNTIME = _RUNTIME, rt
    return previous


__all__ = ["Runtime", "runtime", "set_runtime", "TaskRun", "StatusTable", "LogFollower", "port_accepts"]


def _regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled; UsageError (what was wrong) when it is not a regular expression."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError(f"{pattern!r} is not a valid regular expression: {e}") from None
