"""The IPython magics: a thin layer over the public API of :class:`mwhelpers.workers.Runtime`.

    %cluster [N] [--chief] [--ps K] [--evaluator] [--hosts H1,H2,... | --slurm [--job ID]]
             [--backend NAME] [--option K=V ...] [--python PATH] [--cwd DIR] [--gpus-per-task K]
    %%worker [TASK] [--bg] [--timeout S] [--log PATH] [--ready port|start] [--env K=V ...]
             [--no-stall-fix] [--no-keras-fix] [--verbose]
    %worker  [TASK] [options] SCRIPT [ARGS...]      (TASK all or 0,1: several at once)
    %workers [--timeline [--save PATH]]
    %workerlog [TASK] [-n N] [--follow] [--wait REGEX [--timeout S]]
    %waitworkers [--timeout S]
    %killworker TASK [--signal SIG] [--when REGEX] [--timeout S]
    %killbgscripts
    %kubernetes PATH SCRIPT [ARGS...] --image IMAGE [--tasks N] [--files F1,F2] [--claim PVC] ...
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from . import quietimport
from .errors import UsageError
from .launchoptions import launch_help
from .magicargs import cluster_parser, parse, parse_worker_line

if TYPE_CHECKING:  # for the annotations only: loading the extension imports none of these
    from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult, InteractiveShell

    from .cluster import Cluster
    from .interactive import Interactive
    from .live import LiveViews
    from .pxoutput import TaskValues
    from .status import StatusTable
    from .timeline import Timeline
    from .workers import Runtime

# Loading the extension registers the magics and nothing more: the runtime (the package's
# other modules, psutil) is imported by the first magic that needs it.
BG_ENV = "MWHELPERS_BG"  # mwhelpers.workers.BG_ENV, which a test holds equal to it


def runtime() -> Runtime:
    from .workers import runtime as the_runtime

    return the_runtime()


@magics_class
class WorkerMagics(Magics):
    def __init__(self, shell: InteractiveShell | None = None, session_name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._live: LiveViews | None = None
        self._session_name = session_name  # the notebook's, for the log folder's name

    @property
    def rt(self) -> Runtime:
        rt = runtime()
        if self._session_name is not None:
            rt.session_name = rt.session_name or self._session_name
            self._session_name = None
        return rt

    @property
    def live(self) -> LiveViews:
        """The live views under the cells of background tasks (made on first use)."""
        if self._live is None:
            from .live import LiveViews

            self._live = LiveViews()
        return self._live

    @property
    def in_kernel(self) -> bool:
        """A Jupyter kernel (displays can update); not a terminal IPython."""
        return getattr(self.shell, "kernel", None) is not None

    @line_magic
    def cluster(self, line: str) -> Cluster | None:
        """Define the cluster, or show the current one; returns it (``c = %cluster 2``).

        %cluster [N] [--chief] [--ps K] [--evaluator] [--gpus-per-task K]
                 [--backend NAME | --hosts H1,H2 | --slurm] [BACKEND OPTIONS] [--help]

        N workers (default 2), optionally a chief job, K parameter servers and an
        evaluator.  The backend says how the tasks are started: ``local`` (the
        default: this machine, on free ports reserved for this kernel), ``ssh``
        (``--hosts H1,H2`` is short for ``--backend ssh --hosts H1,H2``: the tasks
        placed over these hosts in turn), ``slurm`` (``--slurm``: the nodes of this
        kernel's Slurm allocation) or one a package registered.  Each backend's own
        options are flags too (``--python PATH``, ``--job ID``, ``--heartbeat S``...),
        or ``--option NAME=VALUE``; ``%cluster --backend NAME --help`` lists them.
        Shows every task, where it runs and the TF_CONFIG it gets.  With no
        arguments, shows the current cluster.
        """
        if not line.strip():
            if self.rt.cluster is None:
                print("No cluster is defined yet; %cluster N defines one "
                      "(the first %%worker defines 2 workers).")
            return self.rt.cluster
        parser, name = cluster_parser(line)
        try:
            a = parser.parse_args(shlex.split(line))
        except ValueError as e:
            raise UsageError(f"%cluster: cannot parse {line!r}: {e}") from None
        if a.help:
            print(parser.format_help())
            return None
        options: dict[str, str] = {}
        for item in a.option:
            key, eq, value = item.partition("=")
            if not eq or not key.isidentifier():
                raise UsageError(f"--option takes NAME=VALUE (an option of the backend), "
                                 f"got {item!r}")
            options[key] = value
        for option in parser.backend_options:
            value = getattr(a, option.name)
            if value is not None:
                if option.name in options:
                    raise UsageError(f"{option.name} given twice: as {option.flag} and --option")
                options[option.name] = value
        workers = 2 if a.workers is None else a.workers
        cluster = self.rt.define_cluster(workers, chief=a.chief, ps=a.ps, evaluator=a.evaluator,
                                         gpus_per_task=a.gpus_per_task, backend=name, **options)
        if a.interactive:
            engines = self.rt.interactive()
            print(f"{len(engines.tasks)} interactive tasks: "
                  + ", ".join(f"{t} (engine {engines.engine_of[t]})" for t in engines.tasks)
                  + "; %%px runs a cell on every one")
            for t in engines.tasks:  # each follows its state and its cells while it runs
                self.live.show(self.rt.runs[t])
        # Returned, not displayed: shown as the cell's result, or kept by ``c = %cluster 2``.
        return cluster

    def _engines(self) -> Interactive:
        engines = self.rt.engines
        if engines is None or engines.closed:
            raise UsageError("no interactive tasks: define the cluster with %cluster N "
                             "--interactive (or call rt.interactive()) first")
        return engines

    @line_cell_magic
    @magic_arguments()
    @argument("tasks", nargs="*", help="the tasks to run on: worker:1, chief:0, 1 for worker:1 "
                                       "(default: every task)")
    @argument("--targets", "-t", default=None, metavar="IDS",
              help="engines by ipyparallel's numbers instead (0,1)")
    @argument("--timeout", type=float, default=None, metavar="S",
              help="after S seconds: the tasks' stacks to their logs, SIGINT, and a report")
    @argument("--grace", type=float, default=None, metavar="S",
              help="how long the others may go on once a task raised (default 3)")
    def px(self, line: str, cell: str | None = None) -> None:
        """Run the cell (or the line's code, %px CODE) on every interactive task at once.

        %%px [TASK ...] [--targets IDS] [--timeout S] [--grace S]

        Output streams as it comes, each line labelled with its task; plots and tables
        show. When a task raises while others wait in a collective, the others are ended
        after --grace seconds (their stacks written to their logs) and the cell fails with
        the task that raised first; Ctrl-C interrupts every task; a task that died is
        reported before the cell runs. %pxget EXPR brings each task's value back.
        """
        engines = self._engines()
        if cell is None:  # %px CODE: the code is the line (no options)
            a, code = None, line
        else:
            a, code = parse(self.px, line), cell
        targets: Any = None
        if a is not None and a.tasks and a.targets:
            raise UsageError("give tasks (worker:1) or --targets (engine numbers), not both")
        if a is not None and a.tasks:
            targets = [engines.cluster.check_task(t) for t in a.tasks]
        elif a is not None and a.targets:
            targets = a.targets
        from .interactive import GRACE

        grace = GRACE if a is None or a.grace is None else a.grace
        engines.run(code, targets, timeout=None if a is None else a.timeout, grace=grace)

    @line_magic
    def pxget(self, line: str) -> TaskValues:
        """Each interactive task's value of an expression, as a table keyed by task
        (returned: ``losses = %pxget loss``; ``.same()`` says whether all are equal).

        %pxget [--tasks T1,T2] EXPRESSION   (the rest of the line, as written)
        """
        tasks = None
        words = line.split(None, 2)
        if words and words[0].startswith("--tasks"):
            flag, eq, value = words[0].partition("=")
            if flag != "--tasks" or not (value or len(words) > 1):
                raise UsageError("%pxget [--tasks T1,T2] EXPRESSION")
            tasks = value or words[1]
            line = line.split(None, 1 if eq else 2)[-1] if len(words) > (1 if eq else 2) else ""
        if not line.strip():
            raise UsageError("%pxget needs an expression: %pxget loss")
        return self._engines().pull(line.strip(), tasks)

    @line_magic
    @magic_arguments()
    @argument("tasks", nargs="*", help="the tasks to restart (default: every task)")
    @argument("--timeout", type=float, default=60.0, metavar="S",
              help="how long the new engines may take to connect")
    def pxrestart(self, line: str) -> None:
        """Start interactive tasks again: fresh processes with the same TF_CONFIG (a
        process sets its collectives up once, so after a failure all restart)."""
        a = parse(self.pxrestart, line)
        engines = self._engines()
        targets = [engines.cluster.check_task(t) for t in a.tasks] or None
        engines.restart(targets, a.timeout)
        print("restarted " + ", ".join(f"{t} (engine {engines.engine_of[t]})"
                                       for t in engines.targets(targets)))
        for t in engines.targets(targets):
            self.live.show(self.rt.runs[t])

    @line_cell_magic
    def worker(self, line: str, cell: str | None = None) -> None:
        """Run a worker task's Python program in its own process.

        %%worker [TASK] [--bg] [--timeout S] [--log PATH] [--ready port|start] [--env K=V ...]
                 [--no-stall-fix] [--no-keras-fix] [--verbose]
        %worker  [TASK] [options] SCRIPT [ARGS...]

        TASK is worker:1, chief:0, ps:0, evaluator:0, or 1 for worker:1
        (default worker:0).  The process gets TF_CONFIG for TASK and the
        kernel's environment otherwise.  TASK all, or a list such as 0,1 or
        ps:0,worker:0, runs the same program as every task of the cluster, or as
        those, all started at once (each with its own TF_CONFIG and log).
        In the foreground its output streams
        into the cell, prefixed with the task, and a failure raises.  With
        --bg it returns once the task is ready (or has ended) and its output
        goes to its log (%workerlog): ready is when its port accepts
        connections, or with --ready start (and for an evaluator, which serves
        no port) once its process has started.  With several tasks, --bg
        returns once all are ready, and one that fails first ends the others
        started with it.  In a notebook a
        live view under the cell follows its state, Keras epoch and step and
        latest line until it ends, while the kernel stays free.  A cell's program
        imports modules from the working directory, as ``python -c`` would.
        --no-stall-fix keeps tf.data autotuning in a MultiWorkerMirroredStrategy
        worker (by default it is switched off so that fit ends when training ends).
        --no-keras-fix runs Keras 3 unmended (by default its fit, evaluate, BackupAndRestore
        and ModelCheckpoint are mended for multi-worker MWMS, keras-team/keras#20585, and
        optimizer.iterations counts every step under a ParameterServerStrategy).
        --verbose streams every line, TensorFlow's informational C++ start-up lines
        included; by default the cell leaves those out (the log keeps them all).
        """
        o = parse_worker_line(line)
        if cell is None and o["script"] is None:
            raise UsageError("%worker needs a SCRIPT to run (or use %%worker with the program "
                             "in the cell)")
        if cell is not None and o["script"] is not None:
            raise UsageError(f"%%worker runs the cell's code; {o['script']!r} looks like a "
                             "script: use the line magic %worker ... SCRIPT for a file")
        task, script, args = o.pop("task"), o.pop("script"), o.pop("args")
        if task is not None and (task.lower() == "all" or "," in task):
            if o.get("log"):
                raise UsageError(f"--log names one file, and each task of {task} writes its "
                                 "own log; leave --log out (%workerlog TASK shows each)")
            tasks = None if task.lower() == "all" else [t for t in task.split(",") if t]
            runs = self.rt.launch_all(code=cell, script=script, args=args, tasks=tasks, **o)
        else:
            runs = [self.rt.launch(task or "worker:0", code=cell, script=script, args=args, **o)]
        if o.get("background") and self.in_kernel:
            for run in runs:
                self.live.show(run)  # updates itself while the task runs

    @line_magic
    @magic_arguments()
    @argument("--timeline", action="store_true",
              help="draw each task's life on one time axis instead, and save it as a PNG")
    @argument("--save", default=None, metavar="PATH",
              help="with --timeline: where to save the PNG (default: timeline.png in the "
                   "log folder)")
    def workers(self, line: str) -> StatusTable | Timeline | None:
        """A status table of every task launched in this kernel (returned: shown as the
        cell's result, or kept by ``table = %workers``).

        --timeline: the current cluster's runs on one time axis (launched, ready, epochs or
        steps, signals, exits, every attempt of a supervised job), returned as a picture and
        saved as a PNG (--save PATH, default timeline.png in the log folder).
        """
        a = parse(self.workers, line)
        if a.save and not a.timeline:
            raise UsageError("--save goes with --timeline")
        if not a.timeline:
            return self.rt.status()
        timeline = self.rt.timeline()
        if not timeline.runs:
            print(timeline)
            return None
        path = timeline.save(a.save or self.rt.log_dir / "timeline.png")
        print(f"timeline saved to {path}")
        return timeline

    @line_magic
    @magic_arguments()
    @argument("task", nargs="?", help="worker:1, chief:0, ... (default: every task)")
    @argument("-n", type=int, default=20, help="how many lines (0: the whole log)")
    @argument("--follow", action="store_true", help="stream the log until the task ends")
    @argument("--grep", default=None, metavar="REGEX",
              help="only the lines that match REGEX (the last N of them)")
    @argument("--wait", default=None, metavar="REGEX",
              help="first wait until the task's log has a line matching REGEX")
    @argument("--timeout", type=float, default=120.0, metavar="S",
              help="how long --wait waits (default 120)")
    def workerlog(self, line: str) -> None:
        """The last N (20) log lines of one task, or of every task.

        --grep REGEX keeps the lines that match (``--grep "^Epoch|loss"``).

        --wait REGEX first waits until the task's log has a line that matches (one already
        there counts), then shows the log; the task goes on running.  If the task ends
        first, the cell says how it ended; after --timeout S the task is ended.

        --follow streams the task's log into the cell until it ends (or the
        cell is interrupted, which leaves the task running).
        """
        a = parse(self.workerlog, line)
        if a.n < 0:
            raise UsageError("-n must be 0 or more")
        if a.wait is not None:
            if not a.task:
                raise UsageError("--wait needs a TASK")
            self.rt.wait_for_line(a.task, a.wait, a.timeout)
        if a.follow:
            if not a.task:
                raise UsageError("--follow needs a TASK")
            self.rt.jobs.current().follow(self.rt.get_run(a.task))
            return
        for ln in self.rt.log(a.task, a.n, grep=a.grep):
            print(ln)

    @line_magic
    @magic_arguments()
    @argument("--timeout", type=float, default=None, metavar="S", help="give up after S seconds")
    def waitworkers(self, line: str) -> None:
        """Wait for every background task to end.

        Raises with the root cause (the first task to die: exit code or
        signal, last log lines) when any failed, and after S seconds names
        what was stuck.
        """
        a = parse(self.waitworkers, line)
        try:
            runs = self.rt.wait(timeout=a.timeout)
        finally:
            self.live.refresh()  # the live views' final state, from this cell (headless too)
        done = [r for r in runs if r.returncode == 0]
        print(f"{len(done)} task(s) finished: " + ", ".join(
            f"{r.task} in {r.uptime:.1f} s" for r in done) if done else "no task was running")

    @line_magic
    @magic_arguments()
    @argument("task", help="worker:1, chief:0, ...")
    @argument("--signal", default="KILL", help="signal to send (default KILL, a crash)")
    @argument("--when", default=None, metavar="REGEX", help="first wait for a log line matching it")
    @argument("--timeout", type=float, default=300.0, metavar="S", help="how long --when waits")
    def killworker(self, line: str) -> None:
        """Signal a task's whole process tree (default SIGKILL, a crash).

        --when waits until the task's log has a line matching REGEX first.
        """
        from .proctree import parse_signal

        a = parse(self.killworker, line)
        sig = parse_signal(a.signal)
        if a.when:
            matched = self.rt.kill_when(a.task, a.when, sig, timeout=a.timeout)
            print(f"{a.task} logged {matched!r}; sent {sig.name} to its process tree")
        else:
            run = self.rt.kill(a.task, sig, why=f"{sig.name} sent by %killworker")
            print(f"sent {sig.name} to {run.task} ({run.process.describe()}) and its descendants; "
                  f"it is now {run.state}")

    @line_magic
    @magic_arguments()
    @argument("path", help="the YAML file to write")
    @argument("script", help="the program every pod runs")
    @argument("args", nargs="*", help="the program's arguments (after --, those that start with -)")
    @argument("--image", required=True, help="a container image with Python, TensorFlow and Keras")
    @argument("--tasks", type=int, default=2, metavar="N", help="pods, one task each (default 2)")
    @argument("--files", default="", metavar="F1,F2", help="the modules the program imports")
    @argument("--job-name", default="tf-multiworker", metavar="NAME",
              help="the Job's and the Service's name")
    @argument("--namespace", default=None, metavar="NS", help="default: kubectl's")
    @argument("--claim", default=None, metavar="PVC",
              help="a PersistentVolumeClaim every pod mounts (for checkpoints), where it starts")
    @argument("--cpus", default=None, help="each pod's CPU request")
    @argument("--memory", default=None, help="each pod's memory request (4Gi)")
    @argument("--gpus", type=int, default=0, metavar="K", help="each pod's GPUs (nvidia.com/gpu)")
    @argument("--env", action="append", default=[], metavar="K=V", help="a variable for every pod")
    def kubernetes(self, line: str) -> None:
        """Write a Kubernetes job that runs SCRIPT as N workers: a headless Service and an
        Indexed Job whose pods build TF_CONFIG from their index (write_kubernetes).
        """
        from .backends.kubernetes import write_kubernetes

        a = parse(self.kubernetes, line)
        env = dict(kv.partition("=")[::2] for kv in a.env)
        files = [f for f in a.files.split(",") if f]
        path = write_kubernetes(a.path, a.script, image=a.image, tasks=a.tasks, args=a.args,
                                files=files, env=env, job_name=a.job_name, namespace=a.namespace,
                                claim=a.claim, cpus=a.cpus, memory=a.memory, gpus=a.gpus)
        ns = f" -n {a.namespace}" if a.namespace else ""
        print(f"wrote {path}: {a.tasks} pods of the Indexed Job {a.job_name}, a headless Service "
              f"and the program in ConfigMaps.\n  kubectl apply --server-side -f {path}\n"
              f"  kubectl logs{ns} -f -l app.kubernetes.io/name={a.job_name} --prefix\n"
              f"  kubectl delete -f {path}")

    @line_magic
    def killbgscripts(self, line: str) -> None:
        """End every background task's whole process tree, and %%script --bg ones.

        Unlike IPython's own %killbgscripts (which signals only the ``bash``
        of ``%%bash --bg`` and leaves its ``python main.py`` running), this
        ends every descendant, plus the orphans that escaped those trees (found
        by the marks in their environment: a task's, or that of a ``%%script
        --bg`` cell).  Other background commands of the kernel, such as
        ``!nohup tensorboard ... &``, are left running.  Escalates SIGINT ->
        SIGTERM -> SIGKILL.
        """
        assert self.shell is not None  # registered on a shell (load), IPython calls it there
        script_magics = self.shell.magics_manager.registry.get("ScriptMagics")
        bg = list(getattr(script_magics, "bg_processes", []) or [])
        pids = [p.pid for p in bg if getattr(p, "returncode", None) is None and getattr(p, "pid", None)]
        report = self.rt.end_all(extra_pids=pids)
        self.live.refresh()
        if script_magics is not None and bg:
            script_magics._gc_bg_processes()
        if report:
            print(f"Ended {len(report)} process(es):")
            for ln in report:
                print("  " + ln)
        else:
            print("No background processes were running.")


# Cell magics of IPython's ScriptMagics that can run a program in the background (--bg).
_SCRIPT_MAGICS = re.compile(r"^\s*%%(bash|sh|script|python\d?|perl|ruby|pypy)\b(.*)$")


class _BackgroundCellMark:
    """While a ``%%bash --bg`` (or any ``%%script --bg``) cell runs, the kernel's environment
    carries ``BG_ENV``: what the cell starts inherits it, and so do that program's
    descendants after they are re-parented. ``%killbgscripts`` ends only marked orphans."""

    def __init__(self, ipython: InteractiveShell) -> None:
        self.ipython = ipython

    def pre_run_cell(self, info: ExecutionInfo | None = None) -> None:
        first = (getattr(info, "raw_cell", "") or "").lstrip("\n").split("\n", 1)[0]
        m = _SCRIPT_MAGICS.match(first)
        if m and "--bg" in m.group(2).split():
            os.environ[BG_ENV] = runtime().session

    def post_run_cell(self, result: ExecutionResult | None = None) -> None:
        os.environ.pop(BG_ENV, None)

    def register(self) -> None:
        self.ipython.events.register("pre_run_cell", self.pre_run_cell)
        self.ipython.events.register("post_run_cell", self.post_run_cell)

    def unregister(self) -> None:
        for name in ("pre_run_cell", "post_run_cell"):
            with contextlib.suppress(ValueError):
                self.ipython.events.unregister(name, getattr(self, name))


_LOADED: dict[InteractiveShell, tuple[WorkerMagics, _BackgroundCellMark]] = {}


# %%worker? lists each option from the table the parser reads.
if WorkerMagics.worker.__doc__:  # None under python -OO
    WorkerMagics.worker.__doc__ += "\n        Options:\n" + "\n".join(
        "        " + line.strip() for line in launch_help().splitlines())


def load(ipython: InteractiveShell) -> None:
    if ipython in _LOADED:
        return
    magics = WorkerMagics(shell=ipython, session_name=ipython.user_ns.get("__session__"))
    ipython.register_magics(magics)
    quietimport.install(_verbose)
    mark = _BackgroundCellMark(ipython)
    mark.register()
    _LOADED[ipython] = (magics, mark)


def _verbose() -> bool:
    """The kernel's runtime's ``verbose``, if there is a runtime yet (none is made here)."""
    workers = sys.modules.get("mwhelpers.workers")
    rt = workers.existing_runtime() if workers is not None else None
    return bool(rt is not None and rt.verbose)


def unload(ipython: InteractiveShell) -> None:
    """Remove the magics (IPython's own %killbgscripts comes back).  Tasks keep running
    (the runtime outlives the extension, so ``%reload_ext`` picks them up again); the
    message says which, and how to end them."""
    loaded = _LOADED.pop(ipython, None)
    if loaded is None:
        return
    magics, mark = loaded
    mark.unregister()
    quietimport.uninstall()
    lazyjax = sys.modules.get("mwhelpers.taskside.lazyjax")  # armed at the kernel's TF import
    if lazyjax is not None:
        lazyjax.uninstall()
    if magics._live is not None:
        magics._live.stop()
    table = ipython.magics_manager.magics
    for kind in ("line", "cell"):
        for name, func in list(table[kind].items()):
            if getattr(func, "__self__", None) is magics:
                del table[kind][name]
    ipython.magics_manager.registry.pop(type(magics).__name__, None)
    script_magics = ipython.magics_manager.registry.get("ScriptMagics")
    if script_magics is not None and hasattr(script_magics, "killbgscripts"):
        table["line"]["killbgscripts"] = script_magics.killbgscripts
    workers = sys.modules.get("mwhelpers.workers")  # None: nothing was ever launched
    rt = workers.existing_runtime() if workers is not None else None
    running = [r for r in rt.runs.values() if r.running] if rt is not None else []
    if running:
        names = ", ".join(str(r.task) for r in running)
        print(f"mwhelpers unloaded; {len(running)} task(s) keep running: {names}. "
              "%load_ext mwhelpers (or %reload_ext) takes them up again, and "
              "mwhelpers.runtime().end_all() ends them.")
