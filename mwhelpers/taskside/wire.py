"""The protocol between the kernel and the processes it starts, declared once for both sides.

Two processes, often on two machines, must agree on it: the kernel (``mwhelpers.spawner``,
``mwhelpers.backends``, ``mwhelpers.exitrecord``) and a task's start-up
(``_bootstrap.py``) or a host's agent (``_agent.py``).  Each side reads its names and formats
here, and nowhere else:

* :class:`Env`: the variables mwhelpers puts in a task's environment;
* :class:`ExitRecord`: how a task's program ended, written by its start-up as JSON beside its
  log (:meth:`ExitRecord.dumps`) and read by the kernel (:meth:`ExitRecord.loads`);
* the agent's header (:func:`header`, :func:`read_header`), the kernel's commands to it
  (:class:`Command`, :func:`command`, :func:`parse_command`) and its reports back
  (:class:`Report`, :func:`report`, :func:`parse_report`);
* an escalation, the signals that end a process and the seconds each is given
  (:func:`steps_text`, :func:`parse_steps`);
* the messages between the kernel and a warm-start server (:class:`Fork`,
  :func:`fork_message`, :func:`read_fork_message`).

:data:`VERSION` is in every header, exit record and warm-start message.  A side that reads
another version says so (the agent refuses the header with a ``bad-header`` report; the kernel
reads no record from it; a warm-start server refuses the task with a ``refused`` message, and
the kernel starts it cold) instead of misreading it.  Raise it whenever a name, a field or a
format here changes.

Standard library only, and cheap to import: every task loads it at its start, and a host
without mwhelpers gets it with the agent (``mwhelpers.backends.agent.AGENT_CODE``).
"""

from __future__ import annotations  # never evaluated: the host's Python may be older than 3.10

import enum
import json
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

VERSION = 2  # of everything below; see the module's text (2: THIS_PYTHON)

TAG = "@mwhelpers"  # the first word of an agent's report, on its standard error


class Env:
    """The variables mwhelpers puts in a task's environment (``settings.SET_BY_MWHELPERS``
    says what each means to a user)."""

    TASK = "MWHELPERS_TASK"  # worker:1
    ATTEMPT = "MWHELPERS_ATTEMPT"  # 1, 2, ...: the attempt of a supervised job
    SESSION = "MWHELPERS_SESSION"  # the kernel's mark (mwhelpers.session)
    GUARD_FD = "MWHELPERS_GUARD_FD"  # the pipe whose end of file means the kernel is gone
    DUMP_FD = "MWHELPERS_DUMP_FD"  # a byte: write every thread's stack to the log
    STANDBY_FD = "MWHELPERS_STANDBY_FD"  # a byte: a standby runs its program
    ENGINE_ID = "MWHELPERS_ENGINE_ID"  # an interactive task's ipyparallel engine id
    EXIT_RECORD = "MWHELPERS_EXIT_RECORD"  # where the start-up writes the ExitRecord
    # A Kubernetes pod's shape (JSON: job, service, tasks, port, peer_timeout,
    # termination_log), written into the Indexed Job by write_kubernetes, read by _podstart.py
    POD = "MWHELPERS_POD"

    # What differs from one task to the next and is never part of how it imports TensorFlow
    # (mwhelpers.warmstart: not part of a warm-start server's key).
    PER_TASK = frozenset({TASK, ATTEMPT, GUARD_FD, DUMP_FD, STANDBY_FD, ENGINE_ID, EXIT_RECORD})
    # What the start-up takes out of the environment before the program runs.
    TAKEN_OUT = frozenset({GUARD_FD, DUMP_FD, STANDBY_FD, EXIT_RECORD})


RECORD_LIMIT = 50_000  # characters an ExitRecord keeps of its message (the start), traceback (the end)


class ExitRecord(NamedTuple):
    """One task's end by an exception: ``type`` (qualified as a traceback's last line names it:
    ``ValueError``, ``tensorflow.python.framework.errors_impl.UnavailableError``),
    ``message``, ``traceback`` (the program's frames, as Python prints them), ``time``
    (``time.time()`` as it ended), ``pid`` (on the host it ran on) and ``exit_code`` (as
    ``subprocess`` says it: 3 for ``sys.exit(3)``, -2 for a KeyboardInterrupt)."""

    type: str
    message: str
    traceback: str
    time: float
    pid: int
    exit_code: int

    def dumps(self) -> str:
        """The record as the file holds it: one JSON object, with :data:`VERSION`."""
        return json.dumps({"version": VERSION, "type": self.type,
                           "message": self.message[:RECORD_LIMIT],
                           "traceback": self.traceback[-RECORD_LIMIT:], "time": self.time,
                           "pid": self.pid, "exit_code": self.exit_code})

    def dumps_within(self, limit: int) -> str:
        """:meth:`dumps` in at most ``limit`` bytes of UTF-8 (a Kubernetes termination message
        keeps 4,096).  What must go goes in this order: the message past a third of the limit
        (its start stays), then the traceback's start (its end, where the error was raised,
        stays).  The type and the numbers stay whole."""
        def size(record: ExitRecord) -> int:
            return len(record.dumps().encode())

        def longest(make: Any, most: int, budget: int) -> ExitRecord:
            low, high = 0, most  # the most characters kept that fit the budget
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if size(make(mid)) <= budget else (low, mid - 1)
            return make(low)  # type: ignore[no-any-return]

        if size(self) <= limit:
            return self.dumps()
        message, tb = self.message[:RECORD_LIMIT], self.traceback[-RECORD_LIMIT:]
        record = self._replace(message=message, traceback="")
        if size(record) > limit // 3:
            record = longest(lambda n: self._replace(message=message[:n], traceback=""),
                             len(message), limit // 3)
        short = record.message
        record = longest(lambda n: self._replace(message=short, traceback=tb[len(tb) - n:]),
                         len(tb), limit)
        return record.dumps()

    @classmethod
    def loads(cls, text: str) -> ExitRecord | None:
        """The record ``text`` holds; None when it is not one, or one of another
        :data:`VERSION` (never raises)."""
        try:
            data = json.loads(text)
            if data.get("version") != VERSION:
                return None
            record = cls(type=data["type"], message=data["message"],
                         traceback=data["traceback"], time=float(data["time"]),
                         pid=int(data["pid"]), exit_code=int(data["exit_code"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not all(isinstance(v, str) for v in (record.type, record.message, record.traceback)):
            return None
        return record

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ExitRecord | None:
        """The record in the file ``path``; None when there is none or it is not one (never
        raises)."""
        try:
            with open(path, encoding="utf-8") as f:
                return cls.loads(f.read())
        except (OSError, ValueError):
            return None

    @property
    def name(self) -> str:
        """The exception's class name without its module: ``UnavailableError``."""
        return self.type.rpartition(".")[2]

    @property
    def summary(self) -> str:
        """The traceback's last line, its message's first line only: ``ValueError: bad``."""
        first = self.message.split("\n", 1)[0]
        return f"{self.type}: {first}" if first else self.type

    @property
    def exited(self) -> bool:
        """It ended by ``sys.exit`` (SystemExit), not by an error it raised."""
        return self.type == "SystemExit"


# -- an escalation ------------------------------------------------------------------------
def steps_text(steps: Iterable[tuple[int, float]]) -> str:
    """``[(9, 3.0)]`` -> ``"9:3"``: an escalation (signal, seconds), as a header or an ``end``
    command carries it."""
    return ",".join(f"{int(sig)}:{grace:g}" for sig, grace in steps)


def parse_steps(text: str) -> list[tuple[int, float]]:
    """``"9:3,15:1"`` -> ``[(9, 3.0), (15, 1.0)]``; ValueError when it is not one."""
    steps = [(int(sig), float(grace)) for sig, _, grace in
             (step.partition(":") for step in text.split(","))]
    if not steps:
        raise ValueError(f"no steps in {text!r}")
    return steps


# -- the agent's header -------------------------------------------------------------------
# Its first line of input: one JSON object.  argv (the task's command, "{dir}" standing for a
# private folder, a first word THIS_PYTHON for the agent's own Python), env, cwd, files
# (name -> text, written into that folder), port (checked free before the start, or null),
# heartbeat (seconds, or null), escalation (steps_text: how the agent ends the task by
# itself), exit_record (the variable that tells the start-up where to write its record, or
# null), script (the program's path, checked to exist, or null), standby, warm (the name of the
# host's warm server to fork the task from, OWN_SERVER for a spare's own, or null).
# A header with "serve" (an abstract socket's name) starts no task: the agent becomes its host's
# warm server for one cluster, a warm-start server (_forkserver.py) importing "first" with env,
# in cwd, from the files, that forks the tasks whose agents connect to that socket.
HEADER_REQUIRED = ("argv", "escalation")
# As argv's first word: the Python that runs the agent (or the Ray backend's relay) there.
THIS_PYTHON = "{python}"


def header(**fields: Any) -> str:
    """The header line, with :data:`VERSION`."""
    return json.dumps({"version": VERSION, **fields})


# A spare agent's first line, before its header: the start-up's files, which the agent writes
# into its folder while it waits (the header then needs only a cell's code); "heartbeat"
# (seconds, or null): the kernel pings the spare, which ends itself once it has heard nothing
# for that long; and optionally "serve" ({"env", "cwd", "first"}): a warm-start server of its
# own to start meanwhile, as a host's is (it reports warm or cold), for a task that must stay in
# the spare's own unit (a Slurm job step).  A header whose "warm" is OWN_SERVER forks its task
# there.
PRELOAD = '{"preload": '
OWN_SERVER = "{own}"


def preload(files: dict[str, str], serve: dict[str, Any] | None = None,
            heartbeat: float | None = None) -> str:
    """A spare's first line (:data:`PRELOAD`): ``files`` (name -> text), with the version, its
    ``heartbeat``, and what its own warm-start server imports (``serve``: env, cwd, first), if
    it starts one."""
    return json.dumps({"preload": files, "version": VERSION, "heartbeat": heartbeat,
                       **({"serve": serve} if serve else {})})


def read_preload(line: str) -> dict[str, Any]:
    """A :func:`preload` line's ``files``, ``heartbeat`` and ``serve`` (None where it has
    none); ValueError as :func:`read_header`'s."""
    data = json.loads(line)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"a preload of protocol version {data.get('version')!r}; this agent "
                         f"speaks {VERSION}")
    serve, heartbeat = data.get("serve"), data.get("heartbeat")
    return {"files": dict(data["preload"]), "serve": dict(serve) if serve else None,
            "heartbeat": float(heartbeat) if heartbeat else None}


def read_header(line: str) -> dict[str, Any]:
    """The header's fields; ValueError saying what is wrong (another version, a field
    missing, not JSON)."""
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("version") != VERSION:
        raise ValueError(f"protocol version {data.get('version')!r}; this agent speaks "
                         f"{VERSION} (the kernel and this agent come from different releases "
                         "of mwhelpers)")
    missing = [k for k in HEADER_REQUIRED if k not in data]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    return data


# -- the kernel's commands to an agent, one per line after the header ---------------------------
class Command(str, enum.Enum):
    PING = "ping"  # answered with a pong report
    SIGNAL = "signal"  # signal N: to the task's process group
    DUMP = "dump"  # the task writes its stacks (a byte on its DUMP_FD pipe)
    DUMP_BY_SIGNAL = "dump-signal"  # the same by SIGUSR1, where the task handles it
    RELEASE = "release"  # a standby runs its program
    END = "end"  # end STEPS: escalate until the group is gone


def command(verb: Command, argument: object = None) -> str:
    """One command's line, without its newline."""
    return verb.value if argument is None else f"{verb.value} {argument}"


def parse_command(line: str) -> tuple[Command, str] | None:
    """``(verb, argument)`` of one command line ('' when it has none); None: not one."""
    verb, _, argument = line.strip().partition(" ")
    try:
        return Command(verb), argument.strip()
    except ValueError:
        return None


# -- an agent's reports, one per line on its standard error, each after TAG ---------------------
class Report(str, enum.Enum):
    STARTED = "started"  # started PID HOSTNAME
    ENDED = "ended"  # ended SIGNAME: the signal of an escalation that ended the group
    PONG = "pong"
    RECORD = "record"  # record JSON: the task's ExitRecord, before its exit
    EXIT = "exit"  # exit CODE (negative: killed by that signal, as subprocess says)
    BAD_HEADER = "bad-header"  # bad-header WHY
    WARM = "warm"  # warm JSON: a warm server (a host's, a spare's own) is ready (Fork.READY fields)
    COLD = "cold"  # cold WHY: a warm server failed, or a task agent could not fork from it


def report(kind: Report, *words: object) -> str:
    """One report's line, without its newline."""
    return " ".join([TAG, kind.value, *map(str, words)])


def parse_report(line: str) -> tuple[Report, str] | None:
    """``(kind, the rest of the line)``; None: not a report (ssh's or srun's own words, or
    a kind this side does not know)."""
    tag, _, rest = line.rstrip("\n").partition(" ")
    if tag != TAG:
        return None
    kind, _, rest = rest.partition(" ")
    try:
        return Report(kind), rest
    except ValueError:
        return None


# -- the warm-start server's messages ---------------------------------------------------------
# One JSON object per packet of a SOCK_SEQPACKET socket (taskside/_forkserver.py says which
# socket carries which), each with VERSION and its kind.  Fields, by kind:
class Fork(str, enum.Enum):
    READY = "ready"  # server, once: gpu_build, env_set {name: value}, env_unset [name], jax
    FAILED = "failed"  # server, once, instead of ready (then it ends): error
    TASK = "task"  # kernel, one per task: argv, env, cwd, pass [NAME] (descriptors attached)
    PID = "pid"  # the forked task, once it has its own session: pid
    EXIT = "exit"  # server, once the task has ended: exit (as subprocess says), pid
    REFUSED = "refused"  # server, when it could not fork the task: error


def fork_message(kind: Fork, **fields: Any) -> bytes:
    """One message's packet."""
    return json.dumps({"version": VERSION, "kind": kind.value, **fields}).encode()


def read_fork_message(data: bytes) -> tuple[Fork, dict[str, Any]]:
    """``(kind, fields)`` of one packet; ValueError saying what is wrong (empty, not JSON,
    another version, an unknown kind)."""
    if not data:
        raise ValueError("no message (the other side closed its socket)")
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    version = message.pop("version", None)
    if type(version) is not int or version != VERSION:  # (True == 1: not a version)
        raise ValueError("a message of another protocol version (the kernel and its "
                         "warm-start server come from different releases of mwhelpers)")
    return Fork(message.pop("kind", None)), message
