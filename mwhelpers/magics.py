"""The IPython magics: a thin layer over :class:`mwhelpers.runtime.Runtime`.

    %cluster [N] [--chief] [--ps K] [--evaluator]
    %%worker [TASK] [--bg] [--timeout S] [--log PATH] [--ready port|start] [--env K=V ...]
    %worker  [TASK] [options] SCRIPT [ARGS...]
    %workers
    %workerlog [TASK] [-n N] [--follow]
    %waitworkers [--timeout S]
    %killworker TASK [--signal SIG] [--when REGEX] [--timeout S]
    %killbgscripts
"""

import argparse
import shlex

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.display import display

from . import proctree
from .cluster import _TASK_RE
from .errors import UsageError
from .workers import default_log_dir, runtime


class _Parser(argparse.ArgumentParser):
    """argparse that raises our UsageError instead of exiting the kernel."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}\nusage: {self.format_usage().strip()}")

    def exit(self, status=0, message=None):
        if message:
            raise UsageError(message)
        raise UsageError(self.format_help())


def _parser(prog, **kw):
    return _Parser(prog=prog, add_help=False, **kw)


def parse_worker_line(line):
    """Split ``[TASK] [options] [SCRIPT [ARGS...]]``.

    Options are read until the first word that is neither an option nor a
    task name; that word is SCRIPT and everything after it belongs to the
    script, options included (as with ``python [opts] script [args]``).
    """
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"cannot parse {line!r}: {e}") from None
    opts = {"task": None, "bg": False, "timeout": None, "log": None, "env": [],
            "ready": "auto", "script": None, "args": []}
    i = 0
    while i < len(words):
        w = words[i]

        def value(name):
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise UsageError(f"{name} needs a value")
            return words[i + 1]

        if w == "--bg":
            opts["bg"] = True
        elif w in ("--timeout", "--log", "--ready"):
            opts[w[2:]] = value(w)
            i += 1
        elif w.startswith(("--timeout=", "--log=", "--ready=")):
            key, val = w[2:].split("=", 1)
            opts[key] = val
        elif w == "--env":
            start = i + 1
            while i + 1 < len(words) and not words[i + 1].startswith("--") and (
                    "=" in words[i + 1] or i + 1 == start):
                i += 1
                opts["env"].append(words[i])
            if i + 1 == start:
                raise UsageError("--env needs KEY=VALUE")
        elif w.startswith("--env="):
            opts["env"].append(w[len("--env="):])
        elif w.startswith("-"):
            raise UsageError(
                f"unknown option {w!r} for %%worker; options: --bg, --timeout S, --log PATH, "
                "--ready port|start, --env K=V"
            )
        elif opts["task"] is None and opts["script"] is None and _TASK_RE.match(w) \
                and not w.endswith(".py"):
            opts["task"] = w
        else:
            opts["script"] = w
            opts["args"] = words[i + 1:]
            break
        i += 1
    return opts


@magics_class
class WorkerMagics(Magics):
    @property
    def rt(self):
        return runtime()

    @line_magic
    def cluster(self, line):
        """Define the local cluster, or show the current one.

        %cluster [N] [--chief] [--ps K] [--evaluator]

        N workers (default 2), optionally a chief job, K parameter servers
        and an evaluator, on free localhost ports reserved for this kernel.
        Shows every task and the TF_CONFIG it gets.  With no arguments,
        shows the current cluster.
        """
        if not line.strip():
            if self.rt.cluster is None:
                print("No cluster is defined yet; %cluster N defines one "
                      "(the first %%worker defines 2 workers).")
            else:
                display(self.rt.cluster)
            return
        p = _parser("%cluster")
        p.add_argument("workers", nargs="?", type=int, default=2)
        p.add_argument("--chief", action="store_true")
        p.add_argument("--ps", type=int, default=0)
        p.add_argument("--evaluator", action="store_true")
        a = p.parse_args(shlex.split(line))
        display(self.rt.define_cluster(a.workers, chief=a.chief, ps=a.ps, evaluator=a.evaluator))

    @line_cell_magic
    def worker(self, line, cell=None):
        """Run a worker task's Python program in its own process.

        %%worker [TASK] [--bg] [--timeout S] [--log PATH] [--ready port|start] [--env K=V ...]
        %worker  [TASK] [options] SCRIPT [ARGS...]

        TASK is worker:1, chief:0, ps:0, evaluator:0, or 1 for worker:1
        (default worker:0).  The process gets TF_CONFIG for TASK and the
        kernel's environment otherwise.  In the foreground its output streams
        into the cell, prefixed with the task, and a failure raises.  With
        --bg it returns once the task's port accepts connections (or it has
        ended) and its output goes to its log (%workerlog).
        """
        o = parse_worker_line(line)
        if cell is None and o["script"] is None:
            raise UsageError("%worker needs a SCRIPT to run (or use %%worker with the program "
                             "in the cell)")
        if cell is not None and o["script"] is not None:
            raise UsageError(f"%%worker runs the cell's code; {o['script']!r} looks like a "
                             "script: use the line magic %worker ... SCRIPT for a file")
        self.rt.launch(
            o["task"], code=cell, script=o["script"], args=o["args"], background=o["bg"],
            timeout=o["timeout"], log=o["log"], env=o["env"], ready=o["ready"],
        )

    @line_magic
    def workers(self, line):
        """Show a status table of every task launched in this kernel."""
        display(self.rt.status())

    @line_magic
    def workerlog(self, line):
        """%workerlog [TASK] [-n N] [--follow]: the last N (20) log lines of one task or all.

        --follow streams the task's log into the cell until it ends (or the
        cell is interrupted, which leaves the task running).
        """
        p = _parser("%workerlog")
        p.add_argument("task", nargs="?")
        p.add_argument("-n", type=int, default=20)
        p.add_argument("--follow", action="store_true")
        a = p.parse_args(shlex.split(line))
        if a.n < 0:
            raise UsageError("-n must be 0 or more")
        if a.follow:
            if not a.task:
                raise UsageError("--follow needs a TASK")
            self.rt.follow(a.task)
            return
        for ln in self.rt.log(a.task, a.n):
            print(ln)

    @line_magic
    def waitworkers(self, line):
        """%waitworkers [--timeout S]: wait for every background task to end.

        Raises with the first failure's cause (task, exit code or signal, last
        log lines) when any failed, and after S seconds names what was stuck.
        """
        p = _parser("%waitworkers")
        p.add_argument("--timeout", type=float, default=None)
        a = p.parse_args(shlex.split(line))
        runs = self.rt.wait(timeout=a.timeout)
        done = [r for r in runs if r.returncode == 0]
        print(f"{len(done)} task(s) finished: " + ", ".join(
            f"{r.task} in {r.uptime:.1f} s" for r in done) if done else "no task was running")

    @line_magic
    def killworker(self, line):
        """%killworker TASK [--signal SIG] [--when REGEX] [--timeout S]

        Signal a task's whole process tree (default SIGKILL, a crash).
        --when waits until the task's log has a line matching REGEX first.
        """
        p = _parser("%killworker")
        p.add_argument("task")
        p.add_argument("--signal", default="KILL")
        p.add_argument("--when", default=None)
        p.add_argument("--timeout", type=float, default=300.0)
        a = p.parse_args(shlex.split(line))
        sig = proctree.parse_signal(a.signal)
        if a.when:
            matched = self.rt.kill_when(a.task, a.when, sig, timeout=a.timeout)
            print(f"{a.task} logged {matched!r}; sent {sig.name} to its process tree")
        else:
            run = self.rt.kill(a.task, sig, why=f"{sig.name} sent by %killworker")
            print(f"sent {sig.name} to {run.task} (pid {run.pid}) and its descendants; "
                  f"it is now {run.state}")

    @line_magic
    def killbgscripts(self, line):
        """End every background task's whole process tree, and %%script --bg ones.

        Unlike IPython's own %killbgscripts (which signals only the ``bash``
        of ``%%bash --bg`` and leaves its ``python main.py`` running), this
        ends every descendant, plus processes started from this kernel that
        were orphaned.  Escalates SIGINT -> SIGTERM -> SIGKILL.
        """
        extra = []
        script_magics = self.shell.magics_manager.registry.get("ScriptMagics")
        bg = list(getattr(script_magics, "bg_processes", []) or [])
        for p in bg:
            if getattr(p, "returncode", None) is None and getattr(p, "pid", None):
                extra += proctree.tree(p.pid)
        report = self.rt.end_all(extra)
        if script_magics is not None and bg:
            script_magics._gc_bg_processes()
        if report:
            print(f"Ended {len(report)} process(es):")
            for ln in report:
                print("  " + ln)
        else:
            print("No background processes were running.")


def load(ipython):
    rt = runtime()
    session = ipython.user_ns.get("__session__")
    if session and rt._log_dir is None:
        rt.log_dir = default_log_dir(session)
    ipython.register_magics(WorkerMagics)
