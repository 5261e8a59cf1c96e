"""A launch request, checked once where it enters, and the run it becomes.

:class:`LaunchRequest` parses and checks everything a caller (a magic, a
script, the supervisor) gives, before anything changes; the runtime then
works with the checked object only.

:class:`TaskRun` is one launch of one task.  Its state lives in one place
and changes only through its transitions::

    starting --mark_ready--> ready            (tasks probed on their port)
    running                                   (tasks ready once started)
    starting | ready | running --exit--> done | failed | killed

The exit transition is made by the launcher's wait thread the moment the
process exits, so ``ended`` is the real exit time.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import results
from .cluster import Task, parse_task
from .errors import UsageError
from .exitrecord import ExitRecord, path_for
from .follow import Event, Follower, LogFeed
from .launchoptions import LAUNCH_OPTIONS, ReadyMode
from .logs import TAIL, tail_lines
from .proctree import describe_exit

if TYPE_CHECKING:
    from .backends.base import LaunchSpec, Process

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
READY_MODES: tuple[ReadyMode, ...] = ("auto", "port", "start")
# A run's readiness once "auto" is decided: probed on its port, or ready once started.
RunReady = Literal["port", "start"]
# A run's state (see the module's text).
State = Literal["starting", "ready", "running", "done", "failed", "killed"]
# The log's events a run keeps on its timeline (its feed's; mwhelpers.follow).
TIMELINE_EVENTS = ("epoch", "step")


def parse_env(items: Mapping[str, object] | Iterable[str] | None) -> dict[str, str]:
    """``{'K': 'V'}`` or ``['K=V', ...]`` -> dict, with clear errors."""
    if items is None:
        return {}
    if isinstance(items, dict):
        pairs = [(str(k), str(v)) for k, v in items.items()]
    else:
        if isinstance(items, str):
            items = [items]
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


def parse_timeout(timeout: str | float | None, name: str = "timeout") -> float | None:
    if timeout is None:
        return None
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number of seconds, got {timeout!r}") from None
    if value <= 0:
        raise UsageError(f"{name} must be more than 0 seconds, got {value:g}")
    return value


@dataclass
class Standby:
    """A task's next process, started ahead (``supervise(standby=True)``): TensorFlow imported,
    waiting until a restart releases it.  ``spec`` is what it was started with, ``ready`` its
    readiness mode, ``number`` its launch number for the task (its log's ``.runN``)."""

    task: Task
    process: Process
    spec: LaunchSpec
    ready: RunReady
    attempt: int
    number: int
    replaced: bool = False  # it died waiting, and a cold start took its log and number


@dataclass
class LaunchRequest:
    """Everything one launch needs, checked."""

    task: Task
    code: str | None = None
    script: Path | None = None
    args: tuple[str, ...] = ()
    background: bool = False
    timeout: float | None = None
    log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready: ReadyMode = "auto"
    stall_fix: bool | None = None  # None: the runtime's default
    keras_fix: bool | None = None  # None: the runtime's default
    verbose: bool | None = None  # True: stream every line (None: the runtime's default)

    @classmethod
    def parse(cls, task: str | int | Task | None = "worker:0", *, code: str | None = None,
              script: str | os.PathLike[str] | None = None, args: Iterable[object] = (),
              **options: Any) -> LaunchRequest:
        """A checked request for ``task`` running ``code`` or ``script`` with ``args``;
        ``options``: the :data:`LAUNCH_OPTIONS` by name (unknown ones are refused)."""
        unknown = sorted(set(options) - {o.name for o in LAUNCH_OPTIONS})
        if unknown:
            raise UsageError(f"unknown launch option {', '.join(unknown)}; the options are "
                             + ", ".join(o.name for o in LAUNCH_OPTIONS))
        background, timeout, log = (options.get(k) for k in ("background", "timeout", "log"))
        env, stall_fix, keras_fix, verbose = (options.get(k) for k in (
            "env", "stall_fix", "keras_fix", "verbose"))
        ready = options.get("ready") or "auto"
        if (code is None) == (script is None):
            raise UsageError("give either the program's code or a script path, not both or neither")
        resolved = None
        if script is not None:
            path = Path(script)
            if not path.is_file():
                raise UsageError(
                    f"script {str(script)!r} does not exist (looked in {Path.cwd()}); "
                    "write it first, e.g. with %%writefile"
                )
            if path.suffix not in (".py", ""):
                raise UsageError(f"{str(script)!r} is not a Python script; workers run Python programs")
            resolved = path.resolve()
        if isinstance(args, str):
            raise UsageError("args must be a list of strings, not one string")
        if ready not in READY_MODES:
            raise UsageError(f"ready must be 'auto', 'port' or 'start', got {ready!r}")
        for name, value in (("stall_fix", stall_fix), ("keras_fix", keras_fix),
                            ("verbose", verbose)):
            if value not in (None, True, False):
                raise UsageError(f"{name} must be True, False or None, got {value!r}")
        return cls(task=parse_task(task), code=code, script=resolved,
                   args=tuple(str(a) for a in args), background=bool(background),
                   timeout=parse_timeout(timeout), log=Path(log) if log else None,
                   env=parse_env(env), ready=ready, stall_fix=stall_fix, keras_fix=keras_fix,
                   verbose=verbose)


class TaskRun:
    """One launch of one task: its process, log, state and outcome."""

    def __init__(self, task: Task, process: Process, log_path: str | os.PathLike[str], port: int,
                 address: str, ready_mode: RunReady, script: str, follower: Follower,
                 attempt: int = 1,
                 cwd: str | None = None, host: str | None = None, cell: bool = False) -> None:
        self.task = task
        self.process = process
        self.log_path = Path(log_path)
        self.port = port
        self.address = address  # host:port that TF_CONFIG names for it
        self.ready_mode = ready_mode
        self.script = script
        self.attempt = attempt
        self.cwd = cwd  # the folder it runs in
        self.host = host  # where it runs (None: this machine)
        self.cell = cell  # ``script`` holds a notebook cell's code
        self.gpus: str | None = None  # its CUDA_VISIBLE_DEVICES when the cluster assigns GPUs
        self.keras_fix = True  # whether its start-up mends Keras 3 (kerasfix.py)
        self.warnings: list[str] = []  # what the look before launch said of its program
        self.ready_after: float | None = None  # seconds from start until ready
        self.note = ""  # who ended it, when not itself
        self.stacks_written = False  # its last dump (job.dump_stacks) holds its main thread
        # An interactive task (an ipyparallel engine: mwhelpers.interactive) and what it is
        # doing ("cell 3 running"), which the status table shows instead of its last log line.
        self.interactive = False
        self.activity = ""
        # Its life for the timeline: (time.time(), kind, text), kind one of launched, ready,
        # signal, epoch, step, exit (epochs and steps are read from its log as it grows).
        self.launched_wall = time.time() - (time.monotonic() - process.started)
        self.events: list[tuple[float, str, str]] = [(self.launched_wall, "launched", f"pid {process.pid}")]
        self._lock = threading.Lock()
        self._state: State = "starting" if ready_mode == "port" else "running"
        process.on_exit(self._exited)
        # Its log, read once as it grows by its runtime's ``follower``, for whoever
        # subscribes (mwhelpers.follow).
        self.feed = LogFeed(self.log_path)
        self.feed.subscribe(on_event=self._log_event)
        follower.follow(self.feed, lambda: process.running)

    # -- transitions -------------------------------------------------------------
    def mark_ready(self) -> bool:
        """The task's port accepts connections (or it counts as ready once started)."""
        with self._lock:
            if self._state in ("starting", "running") and self.ready_after is None:
                self.ready_after = time.monotonic() - self.started
                if self._state == "starting":
                    self._state = "ready"
                self.events.append((self.launched_wall + self.ready_after, "ready", ""))
                return True
        return False

    def mark(self, kind: str, text: str, at: float | None = None) -> None:
        """Add an event to its timeline (``at``: time.time(), default now)."""
        self.events.append((time.time() if at is None else at, kind, text))

    def _log_event(self, event: Event) -> None:
        if event.kind in TIMELINE_EVENTS:  # a line read after the exit is stamped at the exit
            ended = self.ended_wall
            self.mark(event.kind, event.text, at=event.at if ended is None else min(event.at, ended))

    def _exited(self, process: Process) -> None:
        code = process.returncode
        if process.lost:
            self.note = self.note or process.lost
        with self._lock:
            killed = code is not None and code < 0
            self._state = "done" if code == 0 else "killed" if killed else "failed"
        self.mark("exit", self.outcome(), at=process.ended_wall)

    # -- state ---------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._state

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def started(self) -> float:
        return self.process.started

    @property
    def ended(self) -> float | None:
        return self.process.ended

    @property
    def ended_wall(self) -> float | None:
        return self.process.ended_wall

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def running(self) -> bool:
        return self.process.running

    @property
    def failed(self) -> bool:
        code = self.returncode
        return code is not None and code != 0

    @property
    def uptime(self) -> float:
        end = self.ended
        return (end if end is not None else time.monotonic()) - self.started

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the task to exit; its return code (None on timeout)."""
        return self.process.wait(timeout)

    def outcome(self) -> str:
        text = describe_exit(self.returncode)
        return f"{text} ({self.note})" if self.note else text

    @property
    def exit_record(self) -> ExitRecord | None:
        """How its program ended by an exception, as it wrote it beside its log
        (:mod:`mwhelpers.exitrecord`); None while it runs and where it wrote none."""
        return None if self.returncode is None else ExitRecord.read(path_for(self.log_path))

    # -- its log -------------------------------------------------------------------
    def tail(self, n: int = TAIL) -> list[str]:
        """The last ``n`` lines of its log; ``n=0``: the whole log."""
        return tail_lines(self.log_path, n)

    def lines(self) -> list[str]:
        """Every line of its log."""
        return tail_lines(self.log_path, 0)

    def records(self, tag: str = "STEP") -> list[dict[str, Any]]:
        """Every ``TAG ...`` line of its log, parsed (see :mod:`mwhelpers.results`)."""
        return results.records(self.lines(), tag)

    def result(self, tag: str = results.TAG) -> dict[str, Any] | None:
        """The last ``RESULT {...}`` line of its log, parsed; None when there is none."""
        return results.last(self.lines(), tag)

    def last_line(self) -> str:
        lines = [ln for ln in self.tail(5) if ln.strip()]
        return lines[-1] if lines else ""

    def __repr__(self) -> str:
        return f"<TaskRun {self.task} pid={self.pid} {self.state}>"
