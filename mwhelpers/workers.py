"""The worker runtime: launch, watch, wait for, kill and supervise task processes.

One :class:`Runtime` per kernel (``mwhelpers.runtime()`` returns it); the
magics are a thin layer over its methods, and scripts can use it directly.

Every task runs as ``python -u _bootstrap.py SCRIPT ARGS`` in a session of
its own (so its whole process tree can be signalled as one group) with the
kernel's environment plus ``TF_CONFIG`` for its task.  Its output, stdout and
stderr merged, goes to a log file; foreground runs follow that file into the
cell.  A pipe whose write end only this process holds lets every worker
notice our death, however it happens, and kill itself (see _bootstrap.py).
"""

import atexit
import html
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from . import proctree
from .cluster import Cluster, Task, parse_task
from .errors import UsageError, WorkerFailed, WorkerTimeout
from .ports import holder_of, port_in_use

BOOTSTRAP = str(Path(__file__).with_name("_bootstrap.py"))
SESSION_ENV = "MWHELPERS_SESSION"
SERVER_JOBS = ("chief", "worker", "ps")  # tasks that start a gRPC server on their port
TRAINING_JOBS = ("chief", "worker")  # tasks that wait for each other (collectives)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POLL = 0.01  # seconds between readiness probes
_TAIL = 15  # log lines quoted in errors


def _print(line):
    print(line, flush=True)


def port_accepts(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def tail_lines(path, n=_TAIL):
    """Last ``n`` lines of a text file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    lines = [ln.rsplit("\r", 1)[-1] for ln in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines[-n:] if n else lines


def parse_env(items):
    """``{'K': 'V'}`` or ``['K=V', ...]`` -> dict, with clear errors."""
    if items is None:
        return {}
    if isinstance(items, dict):
        pairs = [(str(k), str(v)) for k, v in items.items()]
    else:
        pairs = []
        for item in items:
            if "=" not in item:
                raise UsageError(f"--env expects KEY=VALUE, got {item!r}")
            key, value = item.split("=", 1)
            pairs.append((key, value))
    env = {}
    for key, value in pairs:
        if not _ENV_KEY.match(key):
            raise UsageError(
                f"{key!r} is not a valid environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )
        if key == "TF_CONFIG":
            raise UsageError(
                "TF_CONFIG is set by mwhelpers from the cluster and the task; "
                "change the cluster with %cluster (Runtime.define_cluster) instead"
            )
        env[key] = value
    return env


class LogFollower:
    """Yield the complete new lines of a growing log file."""

    def __init__(self, path, offset=0):
        self.path = path
        self.offset = offset
        self._partial = b""

    def poll(self, final=False):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        self.offset += len(data)
        data = self._partial + data
        parts = data.split(b"\n")
        self._partial = parts.pop()
        if final and self._partial:
            parts.append(self._partial)
            self._partial = b""
        # A progress bar rewrites its line with \r: keep what it shows last.
        return [p.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1] for p in parts]


class TaskRun:
    """One launch of one task: its process, log and outcome."""

    def __init__(self, task, popen, log_path, port, ready_mode, script):
        self.task = task
        self.popen = popen
        self.pid = popen.pid
        self.log_path = Path(log_path)
        self.port = port
        self.ready_mode = ready_mode
        self.script = script
        self.started = time.monotonic()
        self.ready_after = None  # seconds from start until ready
        self.ended = None
        self.note = ""  # who ended it, when not itself

    @property
    def returncode(self):
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    @property
    def running(self):
        return self.returncode is None

    @property
    def failed(self):
        code = self.returncode
        return code is not None and code != 0

    @property
    def state(self):
        code = self.returncode
        if code is None:
            if self.ready_after is not None:
                return "ready"
            return "starting" if self.ready_mode == "port" else "running"
        if code == 0:
            return "done"
        return "killed" if code < 0 else "failed"

    @property
    def uptime(self):
        end = self.ended if self.returncode is not None else time.monotonic()
        return end - self.started

    def outcome(self):
        text = proctree.signal_name(self.returncode)
        return f"{text} ({self.note})" if self.note else text

    def tail(self, n=_TAIL):
        return tail_lines(self.log_path, n)

    def last_line(self):
        lines = [ln for ln in self.tail(5) if ln.strip()]
        return lines[-1] if lines else ""

    def __repr__(self):
        return f"<TaskRun {self.task} pid={self.pid} {self.state}>"


class StatusTable:
    """``%workers``: plain text for terminals and saved notebooks, HTML for JupyterLab."""

    COLUMNS = ("task", "pid", "state", "exit", "uptime", "port", "log", "last log line")

    def __init__(self, rows):
        self.rows = rows

    def __repr__(self):
        if not self.rows:
            return "no tasks have been launched in this kernel"
        table = [self.COLUMNS] + [tuple(str(c) for c in r) for r in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self.COLUMNS) - 1)]
        out = []
        for r in table:
            cells = [r[i].ljust(widths[i]) for i in range(len(widths))] + [r[-1][:80]]
            out.append("  ".join(cells).rstrip())
        return "\n".join(out)

    def _repr_html_(self):
        if not self.rows:
            return "<p>No tasks have been launched in this kernel.</p>"
        colors = {"ready": "#2e7d32", "running": "#2e7d32", "starting": "#f9a825",
                  "done": "#1565c0", "failed": "#c62828", "killed": "#c62828"}
        head = "".join(f"<th>{c}</th>" for c in self.COLUMNS)
        body = ""
        for r in self.rows:
            cells = [html.escape(str(c)) for c in r]
            cells[2] = f'<b style="color:{colors.get(r[2], "inherit")}">{cells[2]}</b>'
            cells[6] = f"<code>{cells[6]}</code>"
            cells[7] = f"<code>{cells[7][:120]}</code>"
            body += "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def default_log_dir(session_name=None):
    root = os.environ.get("MWHELPERS_LOG_DIR")
    root = Path(root) if root else Path.cwd() / "worker_logs"
    name = session_name or os.environ.get("JPY_SESSION_NAME") or "kernel"
    stem = Path(name).stem or "kernel"
    return root / f"{stem}-{os.getpid()}"


def claim_session():
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

    def __init__(self, log_dir=None, echo=_print):
        self._log_dir = Path(log_dir) if log_dir else None
        self.echo = echo
        self.cluster = None
        self.runs = {}  # Task -> latest TaskRun
        self.history = []  # every TaskRun, oldest first
        self._launch_counts = {}
        self._lock = threading.RLock()
        # The parent-death guard: workers get the read end; we keep the write
        # end open (never writing) until this process ends.
        self._guard_r, self._guard_w = os.pipe()
        self.session = claim_session()
        atexit.register(self.shutdown)

    # -- cluster -------------------------------------------------------------
    @property
    def log_dir(self):
        if self._log_dir is None:
            self._log_dir = default_log_dir()
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir

    @log_dir.setter
    def log_dir(self, value):
        self._log_dir = Path(value)

    def _resolve(self, spec):
        """A task name checked against the cluster when there is one."""
        return self.cluster.check_task(spec) if self.cluster else parse_task(spec)

    def running_runs(self):
        return [r for r in self.runs.values() if r.running]

    def define_cluster(self, workers=2, chief=False, ps=0, evaluator=False, host="localhost"):
        """Replace the current cluster (its ports are released)."""
        with self._lock:
            busy = self.running_runs()
            if busy:
                raise UsageError(
                    "tasks of the current cluster are still running ("
                    + ", ".join(str(r.task) for r in busy)
                    + "); end them first (%killbgscripts or %waitworkers)"
                )
            new = Cluster(workers=workers, chief=chief, ps=ps, evaluator=evaluator, host=host)
            if self.cluster is not None:
                self.cluster.close()
            self.cluster = new
            self.runs = {}
            return new

    def ensure_cluster(self):
        if self.cluster is None:
            self.define_cluster(workers=2)
        return self.cluster

    # -- launching -----------------------------------------------------------
    def _check_launch(self, task, code, script, args, env, ready, timeout):
        """Validate everything before anything changes; return normalized values."""
        if (code is None) == (script is None):
            raise UsageError("give either the program's code or a script path, not both or neither")
        task = parse_task(task)
        env = parse_env(env)
        if script is not None:
            path = Path(script)
            if not path.is_file():
                raise UsageError(
                    f"script {str(script)!r} does not exist (looked in {Path.cwd()}); "
                    "write it first, e.g. with %%writefile"
                )
            if path.suffix not in (".py", ""):
                raise UsageError(f"{script!r} is not a Python script; workers run Python programs")
        if timeout is not None:
            try:
                timeout = float(timeout)
            except (TypeError, ValueError):
                raise UsageError(f"timeout must be a number of seconds, got {timeout!r}") from None
            if timeout <= 0:
                raise UsageError(f"timeout must be more than 0 seconds, got {timeout}")
        if ready not in ("auto", "port", "start"):
            raise UsageError(f"ready must be 'auto', 'port' or 'start', got {ready!r}")
        if isinstance(args, str):
            raise UsageError("args must be a list of strings, not one string")
        return task, env, [str(a) for a in args], timeout

    def launch(self, task="worker:0", *, code=None, script=None, args=(), background=False,
               timeout=None, log=None, env=None, ready="auto"):
        """Run a task's program: ``code`` (a string) or ``script`` (a .py file).

        Foreground (default): follow its output into the caller, each line
        prefixed with the task, until it ends; raise :class:`WorkerFailed`
        on a non-zero exit and :class:`WorkerTimeout` after ``timeout`` s.

        ``background=True``: return once the task is ready (its port accepts
        connections; ``ready='start'``: once it is started) or has ended.
        ``timeout`` then bounds the wait for readiness.
        """
        with self._lock:
            task, env, args, timeout = self._check_launch(task, code, script, args, env, ready, timeout)
            created = self.cluster is None
            cluster = self.ensure_cluster()
            try:
                task = cluster.check_task(task)
                self._check_not_running(task)
                if task.type in SERVER_JOBS:
                    self._check_port_free(task)
            except UsageError:
                if created:
                    self.cluster.close()
                    self.cluster = None
                raise
            if ready == "auto":
                ready = "port" if task.type in SERVER_JOBS else "start"
            run = self._spawn(task, code, script, args, env, log, ready)
        if background:
            self._await_ready(run, timeout)
        else:
            self._follow([run], timeout, stream=True)
            self._raise_failures([run])
        return run

    def _check_not_running(self, task):
        run = self.runs.get(task)
        if run is not None and run.running:
            raise UsageError(
                f"{task} is already running (pid {run.pid}, for {run.uptime:.0f} s); "
                f"wait for it (%waitworkers) or end it (%killworker {task}) first"
            )

    def _check_port_free(self, task):
        port = self.cluster.port(task)
        if port_in_use(port):
            raise UsageError(
                f"port {port} of {task} is already taken by {holder_of(port)}; end that "
                "process, or define the cluster again (%cluster) to get new ports"
            )

    def _log_path(self, task, log):
        if log:
            path = Path(log)
            path.parent.mkdir(parents=True, exist_ok=True)
            return path
        n = self._launch_counts.get(task, 0) + 1
        self._launch_counts[task] = n
        suffix = "" if n == 1 else f".run{n}"
        return self.log_dir / f"{task.slug}{suffix}.log"

    def child_env(self, task, extra=None):
        env = dict(os.environ)
        # The kernel's inline plotting backend means nothing in a worker.
        if "inline" in env.get("MPLBACKEND", ""):
            env["MPLBACKEND"] = "Agg"
        env["TF_CONFIG"] = self.cluster.tf_config(task)
        env["MWHELPERS_TASK"] = str(task)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def _spawn(self, task, code, script, args, env, log, ready):
        log_path = self._log_path(task, log)
        if code is not None:
            script = self.log_dir / f"{task.slug}_cell.py"
            script.write_text(code)
        script = str(Path(script).resolve())
        child_env = self.child_env(task, env)
        child_env["MWHELPERS_GUARD_FD"] = str(self._guard_r)
        with open(log_path, "wb") as logf:
            popen = subprocess.Popen(
                [sys.executable, "-u", BOOTSTRAP, script, *args],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=child_env, start_new_session=True, pass_fds=(self._guard_r,),
            )
        run = TaskRun(task, popen, log_path, self.cluster.ports[task], ready, script)
        self.runs[task] = run
        self.history.append(run)
        return run

    # -- readiness and following ----------------------------------------------
    def _await_ready(self, run, timeout, default_timeout=120.0):
        timeout = default_timeout if timeout is None else timeout
        if run.ready_mode == "start":
            run.ready_after = 0.0
            self.echo(f"[{run.task}] started in the background (pid {run.pid}); log: {run.log_path}")
            return run
        self.echo(
            f"[{run.task}] starting in the background (pid {run.pid}); waiting until port "
            f"{run.port} accepts connections ... log: {run.log_path}"
        )
        deadline = run.started + timeout
        while True:
            if port_accepts(run.port):
                run.ready_after = time.monotonic() - run.started
                self.echo(f"[{run.task}] ready after {run.ready_after:.2f} s (port {run.port} is open)")
                return run
            if not run.running:
                if run.failed:
                    self._raise_failures([run])
                self.echo(f"[{run.task}] ended with exit code 0 before it opened port {run.port}")
                return run
            if time.monotonic() >= deadline:
                self._end_stuck([run], f"it did not become ready within {timeout:g} s")
                raise WorkerTimeout(
                    f"{run.task} did not become ready within {timeout:g} s: port {run.port} "
                    f"never accepted connections. Its Python stacks were written to its log "
                    f"before it was ended.\n" + self._tail_text(run),
                    not_ready=[run.task],
                )
            time.sleep(_POLL)

    def _follow(self, runs, timeout, stream, deadline_msg="did not finish", on_line=None,
                stop_when=None, end_on_interrupt=True):
        """Watch ``runs`` until all end (or ``stop_when()`` is true).

        Streams their new log lines with a task prefix when ``stream``; calls
        ``on_line(run, line)`` for each line.  On timeout, dumps the stacks of
        the survivors, ends them and raises WorkerTimeout.  On interrupt
        (Ctrl-C, the notebook's stop button) ends the runs and re-raises.
        """
        followers = {r.task: LogFollower(r.log_path) for r in runs}
        deadline = None if timeout is None else time.monotonic() + timeout
        next_probe = 0.0
        try:
            while True:
                finished = all(not r.running for r in runs)
                for r in runs:
                    for line in followers[r.task].poll(final=finished):
                        if stream:
                            self.echo(f"[{r.task}] {line}")
                        if on_line:
                            on_line(r, line)
                if finished or (stop_when and stop_when()):
                    return
                now = time.monotonic()
                if now >= next_probe:  # note readiness for the status table and errors
                    for r in runs:
                        if r.ready_after is None and r.running and r.task.type in SERVER_JOBS \
                                and port_accepts(r.port):
                            r.ready_after = now - r.started
                    next_probe = now + 0.5
                if deadline is not None and now >= deadline:
                    stuck = [r for r in runs if r.running]
                    self._end_stuck(stuck, f"it {deadline_msg} within {timeout:g} s")
                    raise self._timeout_error(stuck, timeout, deadline_msg)
                time.sleep(0.05)
        except KeyboardInterrupt:
            if not end_on_interrupt:
                raise
            alive = [r for r in runs if r.running]
            for r in alive:
                r.note = "ended by mwhelpers on interrupt"
            self._end_runs(alive, escalation=((signal.SIGTERM, 1.0), (signal.SIGKILL, 3.0)))
            if alive:
                self.echo("interrupted: ended " + ", ".join(str(r.task) for r in alive))
            raise

    def _timeout_error(self, stuck, timeout, what):
        names = ", ".join(str(r.task) for r in stuck)
        not_ready = self.not_ready_tasks()
        msg = f"{names} {what} within {timeout:g} s and {'was' if len(stuck) == 1 else 'were'} ended; "
        msg += "Python stacks were written to the log before ending."
        if not_ready:
            msg += "\nTasks of the cluster that never became ready: " + "; ".join(
                f"{t} ({why})" for t, why in not_ready
            )
            msg += ". A worker waits for all its peers: launch every task of the cluster."
        for r in stuck:
            msg += "\n" + self._tail_text(r)
        return WorkerTimeout(msg, not_ready=[t for t, _ in not_ready])

    def not_ready_tasks(self):
        """(task, reason) for each chief/worker task that never became ready."""
        out = []
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

    def _tail_text(self, run, n=_TAIL):
        lines = run.tail(n)
        if not lines:
            return f"{run.task}'s log {run.log_path} is empty."
        return f"Last lines of {run.task}'s log ({run.log_path}):\n" + "\n".join(
            f"  {ln}" for ln in lines
        )

    # -- ending ----------------------------------------------------------------
    def _procs_of(self, run):
        procs = proctree.tree(run.pid)
        # Descendants that were re-parented after their parent died are no
        # longer in the tree, but they stay in the task's process group.
        seen = {p.pid for p in procs}
        procs += [p for p in proctree.group_members(run.pid) if p.pid not in seen]
        return [p for p in procs if p.pid != os.getpid()]

    def _reap(self):
        for run in self.runs.values():
            run.returncode  # noqa: B018  (poll() reaps our own children, keeping their status)

    def _end_runs(self, runs, escalation=proctree.DEFAULT_ESCALATION, extra=()):
        """End the process trees of ``runs`` plus the ``extra`` processes.

        Returns ``(lines, survivors)``: what ended with which signal, labelled
        with the owning task, and what even SIGKILL did not end.
        """
        owner, procs = {}, []
        for r in runs:
            for p in self._procs_of(r):
                if p.pid not in owner:
                    owner[p.pid] = f"{r.task}: "
                    procs.append(p)
        for p in extra:
            if p.pid not in owner and p.pid != os.getpid():
                owner[p.pid] = ""
                procs.append(p)
        labels = {p.pid: proctree.describe(p) for p in procs}
        ended, survivors = proctree.end_processes(procs, escalation, reap=self._reap)
        for r in runs:
            try:
                r.popen.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        lines = [f"ended {owner[pid]}{labels[pid]} with {how}" for pid, how in ended.items()]
        lines += [f"could NOT end {labels[p.pid]} (still alive after SIGKILL)" for p in survivors]
        return lines, survivors

    def _end_stuck(self, runs, why):
        """Dump the Python stacks of ``runs`` into their logs, then end them."""
        for r in runs:
            if r.running:
                size = r.log_path.stat().st_size if r.log_path.exists() else 0
                try:
                    os.kill(r.pid, signal.SIGUSR1)
                except OSError:
                    continue
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:  # until the dump lands in the log
                    time.sleep(0.05)
                    if r.log_path.exists() and r.log_path.stat().st_size > size:
                        time.sleep(0.1)
                        break
                r.note = f"ended by mwhelpers: {why}"
        self._end_runs(runs, escalation=((signal.SIGKILL, 3.0),))

    def kill(self, task, sig=signal.SIGKILL, wait=True, why=None):
        """Send ``sig`` to a task's whole process tree (fault injection).

        Returns the TaskRun.  With SIGKILL and ``wait``, returns once every
        process of the tree is gone.  ``why`` is recorded in the task's
        outcome (default: "<SIG> sent on request").
        """
        sig = proctree.parse_signal(sig)
        with self._lock:
            if self.cluster is None:
                raise UsageError("no cluster is defined and no task was launched")
            task = self.cluster.check_task(task)
            run = self.runs.get(task)
            if run is None:
                raise UsageError(f"{task} has not been launched; %workers shows the tasks")
            if not run.running:
                raise UsageError(f"{task} is not running: it ended with {run.outcome()}")
            procs = self._procs_of(run)
            run.note = why or f"{sig.name} sent on request"
            proctree.send(procs, sig)
            if wait and sig == signal.SIGKILL:
                proctree.wait_gone(procs, 5.0, reap=self._reap)
                run.popen.wait(timeout=5)
        return run

    def kill_when(self, task, pattern, sig=signal.SIGKILL, timeout=300.0):
        """Wait until ``task``'s log has a line matching ``pattern``, then kill it.

        Deterministic fault injection: kill worker 1 right after it logs,
        say, ``Epoch 2/``.  Returns the matching line.
        """
        sig = proctree.parse_signal(sig)
        task = self._resolve(task)
        run = self.runs.get(task)
        if run is None or not run.running:
            raise UsageError(f"{task} is not running; launch it with --bg first")
        regex = re.compile(pattern)
        found = []

        def on_line(r, line):
            if not found and regex.search(line):
                found.append(line)

        self._follow([run], timeout, stream=False, on_line=on_line,
                     stop_when=lambda: bool(found), deadline_msg=f"never logged {pattern!r}")
        if not found:
            raise UsageError(f"{task} ended ({run.outcome()}) before logging {pattern!r}")
        self.kill(task, sig, why=f"{sig.name} sent when its log matched {pattern!r}")
        return found[0]

    def wait(self, timeout=None, grace_after_failure=30.0):
        """Wait for every background task to end.

        Parameter servers never end by themselves and are not waited for.
        When a task fails, the others get ``grace_after_failure`` s to end
        by themselves (a synchronous job's workers follow their failed peer)
        and are then ended.  Raises WorkerFailed naming the first failure
        (the root cause) and the rest in order, or WorkerTimeout.
        """
        runs = [r for r in self.runs.values() if r.task.type != "ps"]
        waiting = [r for r in runs if r.running]
        for t, why in self.not_ready_tasks():
            if why == "never launched" and waiting:
                self.echo(f"note: {t} was never launched from this kernel; its peers wait for it")
        first_failure = []

        def stop_when():
            if not first_failure:
                failed = [r for r in runs if r.failed]
                if failed:
                    first_failure.append(time.monotonic())
                return False
            return time.monotonic() - first_failure[0] > grace_after_failure

        self._follow(runs, timeout, stream=False, stop_when=stop_when,
                     deadline_msg="did not finish")
        rest = [r for r in runs if r.running]
        if rest:
            self._end_stuck(rest, f"{grace_after_failure:g} s after a peer failed")
        self._raise_failures(runs)
        return runs

    @staticmethod
    def _failures_in_order(runs):
        """The failed runs, the first to end (the root cause) first."""
        return sorted((r for r in runs if r.failed), key=lambda r: r.ended or 0)

    def _raise_failures(self, runs):
        failed = self._failures_in_order(runs)
        if not failed:
            return
        first = failed[0]
        msg = f"{first.task} failed: {first.outcome()}"
        if len(failed) > 1:
            msg += "; then " + ", ".join(f"{r.task} ({r.outcome()})" for r in failed[1:])
        msg += "\n" + self._tail_text(first)
        raise WorkerFailed(msg, [(r.task, r.outcome(), r.tail()) for r in failed])

    def end_all(self, extra=(), escalation=proctree.DEFAULT_ESCALATION):
        """End every task tree, plus ``extra`` psutil processes and escaped
        orphans of this session.  Returns a list of lines saying what ended."""
        with self._lock:
            runs = self.running_runs()
            for r in runs:
                r.note = "ended by %killbgscripts"
            lines, _ = self._end_runs(runs, escalation, extra=list(extra) + self.escaped_orphans())
        return lines

    def escaped_orphans(self):
        """Processes started from this session that lost their parent.

        Every process started from here carries our session mark in its
        environment; one whose parent is gone has been re-parented away from
        us (the ``python main.py`` that IPython's own %killbgscripts leaves
        behind when it kills ``bash``).
        """
        me = os.getpid()
        mine = {p.pid for p in proctree.tree(me)}
        try:
            mine |= {p.pid for p in psutil.Process(me).parents()}
        except psutil.Error:
            pass
        return proctree.carrying(SESSION_ENV, self.session, exclude=mine)

    def shutdown(self):
        """End everything at once (atexit); the guard pipe covers harder deaths."""
        try:
            runs = [r for r in self.runs.values() if r.running]
            if runs:
                self._end_runs(runs, escalation=((signal.SIGKILL, 2.0),))
        except Exception:
            pass

    # -- reporting -----------------------------------------------------------
    def status(self):
        rows = []
        for run in self.runs.values():
            code = run.returncode
            exit_text = "" if code is None else (
                str(code) if code >= 0 else signal.Signals(-code).name
                if -code in signal.valid_signals() else str(code))
            try:  # short paths keep the table readable
                log = os.path.relpath(run.log_path)
            except ValueError:
                log = str(run.log_path)
            rows.append((str(run.task), run.pid, run.state, exit_text, f"{run.uptime:.1f}s",
                         run.port, log, run.last_line()))
        return StatusTable(rows)

    def log(self, task=None, n=20):
        """The last ``n`` lines of one task's log, or of all, prefixed with the task."""
        if task is None or task == "":
            runs = list(self.runs.values())
            if not runs:
                raise UsageError("no task has been launched yet, so there is no log")
        else:
            t = self._resolve(task)
            if t not in self.runs:
                raise UsageError(f"{t} has not been launched, so it has no log")
            runs = [self.runs[t]]
        return [f"[{r.task}] {ln}" for r in runs for ln in r.tail(n)]

    def follow(self, task, timeout=None):
        """Stream one task's log into the caller until it ends."""
        t = self._resolve(task)
        run = self.runs.get(t)
        if run is None:
            raise UsageError(f"{t} has not been launched, so it has no log")
        until = None if timeout is None else time.monotonic() + float(timeout)
        try:
            self._follow([run], None, stream=True, end_on_interrupt=False,
                         stop_when=lambda: until is not None and time.monotonic() > until)
        except KeyboardInterrupt:
            self.echo(f"stopped following {t}; it is still {run.state}")
        return run

    # -- supervision -------------------------------------------------------------
    def supervise(self, script=None, *, code=None, args=(), tasks=None, max_restarts=3,
                  timeout=None, env=None, inject=(), stream=True):
        """Run the cluster's tasks together; when one fails, end all and restart all.

        This is how MultiWorkerMirroredStrategy jobs recover with
        BackupAndRestore: every worker must restart.  ``tasks`` defaults to
        every task of the cluster.  ``inject`` is a list of ``(task, regex)``
        faults applied to the first attempt: the task is killed with SIGKILL
        when its log first matches ``regex``.  Returns the list of attempts,
        each a dict with its runs and what ended it; raises WorkerFailed when
        ``max_restarts`` restarts were not enough.
        """
        cluster = self.ensure_cluster()
        tasks = [cluster.check_task(t) for t in (tasks or cluster.tasks)]
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise UsageError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}")
        faults = [(cluster.check_task(t), re.compile(p)) for t, p in inject]
        attempts = []
        for attempt in range(max_restarts + 1):
            runs = [self.launch(t, code=code, script=script, args=args, env=env,
                                background=True, ready="start") for t in tasks]
            pending_faults = list(faults) if attempt == 0 else []
            events = []

            def on_line(run, line, pending=pending_faults, events=events):
                for fault in list(pending):
                    if fault[0] == run.task and fault[1].search(line) and run.running:
                        pending.remove(fault)
                        self.kill(run.task, signal.SIGKILL, why="fault injected by the supervisor")
                        events.append(f"fault injected: killed {run.task} after it logged {line!r}")
                        self.echo(f"[mwhelpers] {events[-1]}")

            workers = [r for r in runs if r.task.type != "ps"]
            self._follow(runs, timeout, stream=stream, on_line=on_line,
                         stop_when=lambda: any(r.failed for r in runs)
                         or all(not r.running for r in workers))
            failed = self._failures_in_order(runs)
            leftovers = [r for r in runs if r.running]
            for r in leftovers:
                r.note = "ended by the supervisor"
            self._end_runs(leftovers, escalation=((signal.SIGKILL, 3.0),))
            record = {"attempt": attempt + 1, "runs": runs, "events": events,
                      "failed": [(str(r.task), r.outcome()) for r in failed]}
            attempts.append(record)
            if not failed:
                self.echo(f"[mwhelpers] attempt {attempt + 1}: every task finished")
                return attempts
            root = failed[0]
            if attempt == max_restarts:
                self.echo(f"[mwhelpers] attempt {attempt + 1}: {root.task} {root.outcome()}; "
                          f"no restarts left ({max_restarts} used)")
                self._raise_failures(runs)
            self.echo(
                f"[mwhelpers] attempt {attempt + 1}: {root.task} {root.outcome()}; ended the "
                f"other tasks; restarting all {len(tasks)} tasks "
                f"(restart {attempt + 1} of {max_restarts})"
            )
        return attempts


_RUNTIME = None


def runtime():
    """The process-wide Runtime (created on first use)."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = Runtime()
    return _RUNTIME


__all__ = ["Runtime", "runtime", "TaskRun", "StatusTable", "LogFollower", "Task"]
