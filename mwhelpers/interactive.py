"""Interactive tasks: every task of the cluster runs an ipyparallel engine, and one cell runs on
all of them at once.

Each engine is an ordinary mwhelpers task (started through the cluster's backend with its own
TF_CONFIG, its GPUs, the lifeline and the heartbeat), so it dies with the kernel and is ended
as any task is.  ipyparallel's controller runs on this machine as a guarded process of its
own, listening on loopback for a local cluster and on the address the hosts reach otherwise;
its connection files and key live in a folder only this user can read, removed with it.  The
engines get their connection (the key included) in their environment, never on a command line.

What ipyparallel leaves to the caller is done here: a task that raises while its peers wait
inside a collective has them ended (their stacks dumped first: a collective cannot be
interrupted), Ctrl-C interrupts every task, a task that died is reported at once, and a wait
can have a timeout that says where each task was.

    eng = rt.interactive()                 # or %cluster 2 --interactive
    eng.run("import tensorflow as tf; strategy = tf.distribute.MultiWorkerMirroredStrategy()")
    eng.pull("strategy.num_replicas_in_sync")   # {worker:0: 2, worker:1: 2}, as a table
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import failures as failure_records
from .backends.base import LaunchSpec
from .backends.local import LocalLauncher
from .cluster import Cluster, Task
from .diagnosis import explain_stuck
from .ending import end
from .errors import CellFailed, InfrastructureError, UsageError
from .ippresults import Execution
from .job import diagnose_root, dump_stacks, dump_then_end, end_runs
from .logs import shown, tail_lines
from .pxoutput import Printer, TaskValues, plain
from .taskside.wire import Env
from .timeouts import stacks_said

if TYPE_CHECKING:
    from .launchoptions import ReadyMode
    from .taskrun import TaskRun
    from .watcher import CellLimits


class Host(Protocol):
    """What interactive tasks use of the runtime that starts them (its public API)."""

    verbose: bool
    cell_limits: CellLimits
    echo: Callable[[str], None]

    @property
    def log_dir(self) -> Path: ...

    def launch(self, task: Task, *, code: str, background: bool, ready: ReadyMode,
               env: Mapping[str, str]) -> TaskRun: ...

# The program each task runs: an engine whose connection (addresses and key) comes from the
# environment, not from a file on its host; without ipyparallel's nanny, so that signals
# reach the engine itself.
ENGINE_CODE = f"""\
import os
from ipyparallel.engine.app import IPEngine
IPEngine.launch_instance([
    "--IPEngine.id=" + os.environ["{Env.ENGINE_ID}"],
    "--IPEngine.enable_nanny=False",
    "--IPEngine.log_level=ERROR",
])
"""

# The controller, started through the bootstrap (guarded: it dies with the kernel).
# The controller's folder holds its keys.  close() removes it; where the kernel dies first, the
# guard SIGKILLs the controller's process group, so a watcher in a session of its own, holding
# the read end of a pipe that only the controller holds open, removes it at the controller's end.
# The write end is close-on-exec, and a forked child (ipyparallel forks its schedulers on Linux)
# closes its copy at once: schedulers orphaned by a SIGKILL of the controller alone must not
# keep the folder.
CONTROLLER_CODE = """\
import os, subprocess, sys
r, w = os.pipe()
subprocess.Popen(["sh", "-c", 'cat >/dev/null; rm -rf -- "$0"',
                  os.path.dirname(os.path.abspath(__file__))],
                 stdin=r, start_new_session=True)
os.close(r)


def _not_in_children():
    global w
    if w is not None:
        os.close(w)
        w = None


os.register_at_fork(after_in_child=_not_in_children)
from ipyparallel.controller.app import main
sys.exit(main(sys.argv[1:]))
"""

GRACE = 3.0  # seconds peers may go on after a task raised before they count as stuck
INTERRUPT_WAIT = 2.0  # seconds tasks get to stop after Ctrl-C or a timeout before they count as stuck


def _require_ipyparallel() -> Any:
    try:
        import ipyparallel  # type: ignore[import-untyped]  # it ships no types
    except ImportError:
        raise UsageError("interactive tasks need ipyparallel in the kernel's environment and "
                         "on every host: pip install 'mwhelpers[interactive]' (or ipyparallel)"
                         ) from None
    return ipyparallel


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return str(s.getsockname()[0])


class Controller:
    """ipyparallel's controller on this machine, as a guarded process with a private folder."""

    def __init__(self, ip: str, log_path: Path, timeout: float = 30) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mwhelpers-ipp-"))  # mode 0700
        self.cluster_id = f"mwhelpers-{os.getpid()}-{os.path.basename(self.folder)[-8:]}"
        self.ip = ip
        self.log_path = log_path
        self._launcher = LocalLauncher()
        self.profile = self.folder / "profile"
        script = self.folder / "controller.py"
        script.write_text(CONTROLLER_CODE)
        args = [f"--ip={ip}", f"--location={ip}", f"--cluster-id={self.cluster_id}",
                f"--profile-dir={self.profile}", "--log-level=WARN",
                "--HubFactory.db_class=NoDB", "--ping=1000"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("IPP_CONNECTION_INFO", None)
        self.process = self._launcher.start(LaunchSpec(
            script=str(script), args=args, env=env, log_path=log_path, cell=True))
        security = self.profile / "security"
        self.client_file = security / f"ipcontroller-{self.cluster_id}-client.json"
        self.engine_file = security / f"ipcontroller-{self.cluster_id}-engine.json"
        deadline = time.monotonic() + timeout
        while not (self.client_file.exists() and self.engine_file.exists()):
            if not self.process.running:
                self.close()
                raise InfrastructureError(
                    "ipyparallel's controller exited before it was ready; its log "
                    f"({log_path}) ends with:\n" + "\n".join(tail_lines(log_path)))
            if time.monotonic() > deadline:
                self.close()
                raise InfrastructureError(f"ipyparallel's controller wrote no connection file "
                                          f"within {timeout:g} s (log: {log_path})")
            time.sleep(0.05)
        time.sleep(0.05)  # both files are written whole before the next starts

    def engine_connection(self) -> str:
        """The engines' connection information (addresses and key), as JSON."""
        return self.engine_file.read_text()

    @property
    def running(self) -> bool:
        return self.process.running

    def close(self) -> None:
        """End the controller and its schedulers, and remove its folder (files and key)."""
        # A controller that died alone (SIGKILL, the OOM killer) left its forked schedulers in
        # its process group: end() passes over a process that no longer runs, so name them.
        orphans = [] if self.process.running else self.process.processes()
        end([(self.process, "ipyparallel's controller")], local=orphans)
        self._launcher.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Interactive:
    """The engines of one cluster's tasks and ipyparallel's controller and client."""

    def __init__(self, rt: Host, cluster: Cluster, timeout: float = 60) -> None:
        self.ipp = _require_ipyparallel()
        self.rt = rt
        self.cluster = cluster
        self.tasks: list[Task] = list(cluster.tasks)
        self.cells = 0  # cells run so far
        self.engine_of: dict[Task, int] = {}
        self._gone: set[int] = set()  # ids of engines whose tasks were ended
        self._printer: Printer | None = None  # the running cell's, while it runs
        self._zmq: Any = None  # the client's zmq context
        self._next_id = 0  # engines are numbered in task order, new ones after the old
        self.runs: dict[Task, TaskRun] = {}
        if cluster.remote:
            first = cluster.address(self.tasks[0]).rsplit(":", 1)[0]
            ip = address_towards(first)
        else:
            ip = "127.0.0.1"
        self.controller = Controller(ip, rt.log_dir / "ipcontroller.log", timeout)
        self.client: Any = None
        try:
            import zmq  # ipyparallel's own dependency

            # A zmq context of its own, destroyed with the client (ipyparallel's default, the
            # process-wide one, would keep this cluster's sockets until the process exits).
            self._zmq = zmq.Context()
            self.client = self.ipp.Client(str(self.controller.client_file),
                                          profile_dir=str(self.controller.profile),
                                          timeout=timeout, context=self._zmq)
            self._start_engines(self.tasks, timeout)
        except BaseException:
            self.close()
            raise

    # -- engines ------------------------------------------------------------------------
    def _start_engines(self, tasks: Sequence[Task], timeout: float) -> None:
        connection = self.controller.engine_connection()
        for task in tasks:
            run = self.rt.launch(task, code=ENGINE_CODE, background=True, ready="start",
                                 env={"IPP_CONNECTION_INFO": connection,
                                      Env.ENGINE_ID: str(self._next_id)})
            self._next_id += 1
            run.interactive = True
            self.runs[task] = run
        self._await_engines(tasks, timeout)

    def _await_engines(self, tasks: Sequence[Task], timeout: float) -> None:
        """Wait until the engines of ``tasks`` have registered; learn each one's id."""
        deadline = time.monotonic() + timeout
        wanted = {str(t) for t in tasks}
        while True:
            self._raise_if_dead(tasks, "while its engine was starting")
            ids = [eid for eid in self.client.ids if eid not in self._gone]
            if ids:
                names = self._evaluate(ids, "__import__('os').environ['MWHELPERS_TASK']",
                                       max(1.0, deadline - time.monotonic()))
                seen = {name: eid for eid, name in zip(ids, names, strict=True) if name in wanted}
                if len(seen) == len(wanted):
                    for name, eid in seen.items():
                        self.engine_of[self.cluster.check_task(name)] = eid
                    return
            if time.monotonic() > deadline:
                missing = sorted(wanted - {str(t) for t in self.engine_of})
                raise InfrastructureError(
                    f"the engines of {', '.join(missing)} did not reach ipyparallel's controller "
                    f"at {self.controller.ip} within {timeout:g} s; a firewall between the "
                    "hosts and this machine is the usual cause (logs: "
                    + ", ".join(str(self.runs[self.cluster.check_task(m)].log_path)
                                for m in missing) + ")")
            time.sleep(0.1)

    def _raise_if_dead(self, tasks: Iterable[Task], when: str) -> None:
        dead = [self.runs[t] for t in tasks if t in self.runs and not self.runs[t].running]
        if dead:
            lines = []
            for r in dead:
                lines.append(f"{r.task} ended {when}: {r.outcome()}; the last lines of its log "
                             f"({r.log_path}):")
                lines += [f"  {ln}" for ln in r.tail(10)]
            raise CellFailed("\n".join(lines + [
                "Start the tasks again with %pxrestart (rt.interactive().restart()): a "
                "cluster's tasks set their collectives up together, so all restart."]),
                dead=[r.task for r in dead])

    def targets(self, spec: str | Task | int | Iterable[str | Task | int] | None = None
                ) -> list[Task]:
        """Tasks in cluster order from a name (``worker:1``), a list of names, an engine's
        number as ipyparallel counts, or None (every task)."""
        if spec is None or spec == "all":
            return list(self.tasks)
        items = spec.split(",") if isinstance(spec, str) else (
            [spec] if isinstance(spec, (int, Task)) else list(spec))
        chosen = set()
        by_id = {eid: t for t, eid in self.engine_of.items()}
        for item in items:
            if isinstance(item, int) and not isinstance(item, Task) or (
                    isinstance(item, str) and item.strip().isdigit()):
                eid = int(item)
                if eid not in by_id:
                    raise UsageError(f"no engine {eid}; the engines are "
                                     + ", ".join(f"{e} ({t})" for e, t in sorted(by_id.items())))
                chosen.add(by_id[eid])
            else:
                chosen.add(self.cluster.check_task(item.strip() if isinstance(item, str) else item))
        return [t for t in self.tasks if t in chosen]

    def view(self, targets: Any = None) -> Any:
        """ipyparallel's DirectView of ``targets`` (default: every task), in task order."""
        return self.client[[self.engine_of[t] for t in self.targets(targets)]]

    # -- running cells ----------------------------------------------------------------------
    def run(self, code: str, targets: Any = None, timeout: float | None = None,
            grace: float = GRACE, echo: Callable[[Task, str, str], None] | None = None
            ) -> TaskValues:
        """Run ``code`` on ``targets`` (default: every task) at once; return each task's value
        of the code's last expression (None when it has none).

        Output streams as it comes, each line labelled with its task (``echo(task, stream,
        text)`` receives it; default: this process's stdout and stderr).  A task that raises
        while others are still running gives them ``grace`` seconds; those still running
        then are stuck (in a collective, most often): their stacks go to their logs and they
        are ended.  ``timeout``: seconds to wait for every task; then their stacks are dumped,
        they are interrupted (SIGINT), those that do not stop within ``INTERRUPT_WAIT``
        seconds are ended, and :class:`CellFailed` says where each was.
        """
        tasks = self.targets(targets)
        self._raise_if_dead(tasks, "before this cell")
        code = code.strip("\n")  # the engine numbers the cell's lines from its first
        self.cells += 1
        n = self.cells
        for t in tasks:
            self.runs[t].activity = f"cell {n} running"
            self.runs[t].mark("cell", f"{n} started")
        eids = [self.engine_of[t] for t in tasks]
        ar = Execution(self.client[eids].execute(code, silent=False, block=False))
        # As a %%worker cell shows a task's output: quiet unless verbose, within the cell limits.
        printer = Printer([self.runs[t] for t in tasks], echo, self.rt.echo,
                           quiet=not self.rt.verbose, limits=self.rt.cell_limits)
        callbacks = printer.attach(ar)
        self._printer = printer
        try:
            return self._await(ar, tasks, n, timeout, grace, code)
        finally:
            self._printer = None
            ar.wait_for_output(0.5)
            printer.detach(ar, callbacks)
            printer.flush()
            printer.finish()

    def _await(self, ar: Execution, tasks: list[Task], n: int, timeout: float | None,
               grace: float, code: str) -> TaskValues:
        started = time.monotonic()
        first_error: float | None = None
        futures = dict(zip(tasks, ar.engines, strict=True))
        try:
            while not ar.ready():
                ar.wait(0.05)
                now = time.monotonic()
                dead = [t for t in tasks if not self.runs[t].running]
                failed = [t for t, f in futures.items() if f.error() is not None]
                if failed and first_error is None:
                    first_error = now
                if dead:
                    return self._fail(ar, tasks, n, code, grace, dead=dead)
                if first_error is not None and now - first_error > grace:
                    return self._fail(ar, tasks, n, code, grace)
                if timeout is not None and now - started > timeout:
                    return self._fail(ar, tasks, n, code, grace, timed_out=timeout)
        except KeyboardInterrupt:
            return self._interrupted(ar, tasks, n, code)
        if any(f.error() is not None for f in futures.values()):
            return self._fail(ar, tasks, n, code, grace)
        for t in tasks:
            self.runs[t].activity = f"idle after cell {n}"
            self.runs[t].mark("cell", f"{n} ok")
        ar.wait_for_output(5)  # the results arrive with the rest of the output
        values = {t: plain(f.value()) for t, f in futures.items()}
        return TaskValues(f"cell {n}", values)

    def _stop(self, ar: Execution, tasks: list[Task], busy: list[Task]) -> list[Task]:
        """SIGINT to the ``busy`` tasks; those still running the cell ``INTERRUPT_WAIT``
        seconds later (stuck where Python cannot interrupt) are returned."""
        for t in busy:
            if self.runs[t].running:
                self.runs[t].process.send(signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_WAIT
        while time.monotonic() < deadline and not ar.ready():
            ar.wait(0.05)
        return [t for t, f in zip(tasks, ar.engines, strict=True)
                if not f.done() and self.runs[t].running]

    def _interrupted(self, ar: Execution, tasks: list[Task], n: int, code: str) -> TaskValues:
        """Ctrl-C: SIGINT to every task still running the cell; those that do not stop within
        a moment are stuck and ended."""
        busy = [t for t, f in zip(tasks, ar.engines, strict=True) if not f.done()]
        stuck = self._stop(ar, tasks, busy)
        if not stuck:
            for t in tasks:
                self.runs[t].activity = f"idle after cell {n} (interrupted)"
                self.runs[t].mark("cell", f"{n} interrupted")
            raise KeyboardInterrupt
        return self._fail(ar, tasks, n, code, 0, interrupted=True)

    def _fail(self, ar: Execution, tasks: list[Task], n: int, code: str, grace: float,
              dead: Sequence[Task] = (), interrupted: bool = False,
              timed_out: float | None = None) -> TaskValues:
        """Raise :class:`CellFailed` for cell ``n`` (``code``): the tasks that died or raised
        first, then those still running it, ended (stacks dumped first) unless the cell
        only timed out (then interrupted), with where each was."""
        futures = dict(zip(tasks, ar.engines, strict=True))
        errors = {t: e for t, f in futures.items() if (e := f.error()) is not None}
        busy = [t for t, f in futures.items() if not f.done() and self.runs[t].running]
        finished = [t for t, f in futures.items() if f.done() and t not in errors]
        if busy and self._printer is not None:  # their stack dumps go to their logs only
            self._printer.mute()
        lines: list[str] = []
        for t in dead:
            lines.append(f"{t} died while running cell {n}: {self.runs[t].outcome()}")
        lines += self._why_died(dead)
        for t, err in errors.items():
            lines.append(f"{t} raised {_describe(err)}")
        for t, err in errors.items():
            lines.append(f"[{t}] " + "\n".join(_traceback(err)).replace("\n", f"\n[{t}] "))
        stuck_runs = [self.runs[t] for t in busy]
        if busy:
            if timed_out is not None:  # stacks first, then a chance to stop: maybe only slow
                dump_stacks(stuck_runs)
                still = self._stop(ar, tasks, busy)
                head = (f"{', '.join(map(str, busy))} did not finish cell {n} within "
                        f"{timed_out:g} s; {_stacks_written(stuck_runs, 'interrupted (SIGINT)')}")
                if still:
                    end_runs([self.runs[t] for t in still],
                             f"did not stop at SIGINT after cell {n} timed out")
                    head += (f"; {', '.join(map(str, still))} did not stop within "
                             f"{INTERRUPT_WAIT:g} s: stuck where Python cannot interrupt (a "
                             "collective waiting for a peer, most often), so ended")
            elif interrupted:  # stuck: the job's way to end such tasks, stacks first
                dump_then_end(stuck_runs, f"stuck in cell {n}")
                head = (f"{', '.join(map(str, busy))} did not stop within {INTERRUPT_WAIT:g} s "
                        "of Ctrl-C (SIGINT): stuck where Python cannot interrupt (a "
                        f"collective, most often); {_stacks_written(stuck_runs, 'ended')}")
            elif dead:  # (no grace: a peer that died never joins the collective)
                dump_then_end(stuck_runs, f"stuck in cell {n}")
                head = (f"{', '.join(map(str, busy))} still ran cell {n} when "
                        f"{', '.join(map(str, dead))} died: waiting in a collective for a peer "
                        "that will never join, most likely, which no signal interrupts; "
                        f"{_stacks_written(stuck_runs, 'ended')}")
            else:
                dump_then_end(stuck_runs, f"stuck in cell {n}")
                head = (f"{', '.join(map(str, busy))} still ran cell {n} {grace:g} s after "
                        f"{', '.join(map(str, errors))} raised: waiting in a "
                        "collective for a peer that will never join, most likely, which no "
                        f"signal interrupts; {_stacks_written(stuck_runs, 'ended')}")
            where, found = explain_stuck(stuck_runs, [self.runs[t] for t in self.tasks])
            lines.append(head + ".")
            lines += [ln for f in found for ln in f.lines()]
            if where:
                lines.append("Where each was (its stacks are in its log):")
                lines += [_in_cell(ln, code) for ln in where]
            if finished and not errors and not dead:
                lines.append(
                    f"{', '.join(map(str, finished))} finished the cell meanwhile: a "
                    "collective that some tasks run and others skip (a training step, next() "
                    "on a distributed dataset's iterator, strategy.reduce) waits for ever for "
                    "the tasks that skipped it.")
            if timed_out is not None and any(
                    self.runs[t].running for t in busy) and any("inside TensorFlow" in ln
                                                                for ln in where):
                lines.append("A task interrupted inside TensorFlow may have left a collective "
                             "half done, which its peers would join out of step: start the "
                             "cluster again before the next step (%pxrestart, "
                             "rt.interactive().restart()).")
        ended = [t for t in self.tasks if not self.runs[t].running]
        if ended:
            lines.append(f"Ended now: {', '.join(map(str, ended))}. A process's collectives are "
                         "set up once, so the cluster starts again as a whole: %pxrestart "
                         "(rt.interactive().restart()).")
        for t in tasks:
            state = "raised" if t in errors else "ended" if t in ended else (
                "timed out" if timed_out is not None else "ok")
            self.runs[t].activity = f"cell {n} {state}"
            self.runs[t].mark("cell", f"{n} {state}")
        raise CellFailed("\n".join(lines), errors={t: _describe(e) for t, e in errors.items()},
                         dead=list(dead), stuck=busy)

    def _why_died(self, dead: Sequence[Task]) -> list[str]:
        """What the job's failure report says of the first of ``dead`` to die (what it means,
        what it raised, its log's last lines), as a failed ``%waitworkers`` says it."""
        found = failure_records.in_order([self.runs[t] for t in dead])
        if not found:  # (an engine that exited 0: its outcome says all)
            return []
        diagnose_root(found, [self.runs[t] for t in self.tasks])
        return failure_records.details(found[0])

    # -- values ------------------------------------------------------------------------------
    def pull(self, expression: str, targets: Any = None, timeout: float = 30) -> TaskValues:
        """Each task's value of ``expression`` (a name, or any expression), as a table."""
        tasks = self.targets(targets)
        self._raise_if_dead(tasks, "before this call")
        eids = [self.engine_of[t] for t in tasks]
        try:
            got = self._evaluate(eids, expression, timeout)
        except self.ipp.error.CompositeError as e:
            raise CellFailed(f"{expression!r} could not be evaluated: {e}") from None
        return TaskValues(expression, dict(zip(tasks, got, strict=True)))

    def _evaluate(self, eids: list[int], expression: str, timeout: float) -> list[Any]:
        """``expression``'s value on each engine of ``eids`` (through the engines' own
        namespace: the engines need nothing of mwhelpers)."""
        view = self.client[eids]
        view.execute(f"_mwhelpers_value = ({expression})", block=False).get(timeout)
        values: list[Any] = view.pull("_mwhelpers_value", block=False).get(timeout)
        view.execute("del _mwhelpers_value", block=False)
        return values

    def push(self, values: Mapping[str, Any], targets: Any = None, timeout: float = 30) -> None:
        """Set names in every task's namespace."""
        tasks = self.targets(targets)
        self._raise_if_dead(tasks, "before this call")
        self.client[[self.engine_of[t] for t in tasks]].push(dict(values), block=False).get(timeout)

    # -- restarts and the end ---------------------------------------------------------------
    def restart(self, targets: Any = None, timeout: float = 60) -> None:
        """Fresh engines (new processes, the same TF_CONFIG) for ``targets`` (default: every
        task): TensorFlow sets a process's collectives up once."""
        tasks = self.targets(targets)
        live = [self.runs[t] for t in tasks if self.runs[t].running]
        end_runs(live, "restarted")
        for t in tasks:
            if t in self.engine_of:
                self._gone.add(self.engine_of.pop(t))
        self._start_engines(tasks, timeout)

    def close(self) -> None:
        """End the engines, the client and the controller."""
        live = [r for r in self.runs.values() if r.running]
        if live:
            end_runs(live, "the interactive cluster was closed")
        if self.client is not None:
            try:
                self.client.close(linger=0)  # the engines are gone: nothing to deliver
                self._zmq.destroy(linger=0)
            except Exception:
                pass
            self.client = None
        self.controller.close()

    @property
    def closed(self) -> bool:
        return self.client is None


def _in_cell(where: str, code: str) -> str:
    """A stack's place in an engine's cell (IPython names it ``<number>.py``) said as the
    cell's line and its text."""
    m = re.search(r"\b\d+\.py line (\d+)\b.*$", where)
    lines = code.splitlines()
    if not m or not 0 < int(m.group(1)) <= len(lines):
        return where
    k = int(m.group(1))
    return where[:m.start()] + f"line {k} of the cell: {lines[k - 1].strip()}"


def _describe(err: BaseException) -> str:
    name = getattr(err, "ename", type(err).__name__)
    value = getattr(err, "evalue", str(err))
    return f"{name}: {value}" if value else str(name)


def _traceback(err: BaseException) -> list[str]:
    render = getattr(err, "render_traceback", None)
    lines = list(render()) if render else [str(err)]
    return [shown(ln) for ln in lines]


def _stacks_written(runs: Sequence[TaskRun], then: str) -> str:
    return f"{stacks_said(runs)}, and {'it was' if len(runs) == 1 else 'they were'} {then}"


