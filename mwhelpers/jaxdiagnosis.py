"""What a failed or stuck job of Keras 3 on JAX across processes means (keras.distribution).

Rules of :mod:`mwhelpers.diagnosis` for JAX, each from evidence that leaves no doubt (what
the tasks printed and the stacks a stuck task wrote; messages as JAX 0.10 writes them):

* a task stuck in ``jax.distributed.initialize`` (every process waits there until all have
  connected to JAX's coordinator, which process 0 starts on its port; JAX gives up after its
  ``initialization_timeout``, 300 s when keras.distribution calls it): the coordinator
  waiting for a process that never started, or a process waiting for a coordinator that
  never started;
* process 0 that could not start the coordinator because its port was taken
  ("Failed to start RPC server", after gRPC's "Failed to add port to server");
* tasks that JAX ended when its initialization_timeout ran out (it aborts them: "Terminating
  process because the JAX distributed service detected fatal errors ... DEADLINE_EXCEEDED",
  on the RPC CoordinationService/RegisterTask);
* a task that fetched a whole variable split over several processes' devices (a
  ``ModelParallel`` mesh axis that crosses processes): JAX refuses ("Fetching value for
  `jax.Array` that spans non-addressable (non process local) devices"); Keras's
  ``BackupAndRestore``, ``ModelCheckpoint``, ``save_weights`` and ``get_weights`` fetch every
  variable whole, and Keras's ``OrbaxCheckpoint`` is the way to save such a model;
* Orbax given a relative folder ("Checkpoint path should be absolute"): ``OrbaxCheckpoint``'s
  first save raises it, and ``load_weights`` of such a folder on a distribution logs it and
  then fails inside Keras (Keras 3.15: "'NoneType' object has no attribute 'items'").

Each rule returns ``(key, cause, advice)``, or None; :mod:`mwhelpers.diagnosis` makes
its findings of them.  The processes are the chief and the workers in TF_CONFIG's order
(chief first), numbered from 0, as :meth:`mwhelpers.cluster.Cluster.processes` gives them
their ``KERAS_DISTRIBUTION_PROCESS_ID``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from . import stacks
from .ports import holder_of

if TYPE_CHECKING:
    from .cluster import Task
    from .taskrun import TaskRun

Rule = tuple[str, str, str]  # (key, cause, advice)

_DISTRIBUTED = "/jax/_src/distributed.py"
_NO_SERVER = "Failed to start RPC server"
_SERVICE = "get_distributed_runtime_service"  # where JAX starts its coordinator service
_ABORTED = "Terminating process because the JAX distributed service detected fatal errors"
_REGISTER = "CoordinationService/RegisterTask"
_SPLIT = "spans non-addressable (non process local) devices"
_RELATIVE = re.compile(r"Checkpoint path should be absolute\. Got (\S+)")
_PORT_LINE = re.compile(r"Failed to add port to server: .* resolved for '(?P<address>[^']*:(?P<port>\d+))'")
_GIVES_UP = ("JAX lets no process go on until all of them have connected to its coordinator "
             "(it gives up after its initialization_timeout, 300 s as keras.distribution calls it)")
_LAUNCH_ALL = ("launch every chief and worker task (%worker all --bg PROGRAM), or define the "
               "cluster with as many tasks as the processes you run (%cluster N)")


def in_initialize(lines: Sequence[str]) -> bool:
    """Whether the last stack dump in a task's log ``lines`` has its program's main thread
    inside ``jax.distributed.initialize`` (waiting for its peers or its coordinator)."""
    return any(f.file.endswith(_DISTRIBUTED) and f.func == "initialize"
               for f in stacks.main_stack(lines))


def _processes(tasks: Iterable[Task]) -> list[Task]:
    """The chief and the workers among ``tasks``, in the order of their process ids."""
    known = {t for t in tasks if t.type in ("chief", "worker")}
    return sorted(known, key=lambda t: (t.type != "chief", t.index))


def _names(tasks: Sequence[object]) -> str:
    names = [str(t) for t in tasks]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _numbered(tasks: Sequence[Task], processes: Sequence[Task]) -> str:
    """'process 1 (worker:1)', 'processes 1 (worker:1) and 2 (worker:2)'."""
    each = [f"{processes.index(t)} ({t})" for t in tasks]
    return ("process " if len(each) == 1 else "processes ") + _names(each)


def stuck(stuck_runs: Sequence[TaskRun], runs: Sequence[TaskRun],
          not_ready: Sequence[tuple[Task, str]],
          lines_of: Callable[[TaskRun], list[str]]) -> Rule | None:
    """Why tasks stuck in ``jax.distributed.initialize`` waited: ``stuck_runs`` (their stacks
    dumped; ``lines_of(run)`` reads a log), ``runs`` every run of the job, ``not_ready`` the
    training tasks that never became ready, with why."""
    waiting = [r for r in stuck_runs if in_initialize(lines_of(r))]
    return _waited(waiting, runs, not_ready, "") if waiting else None


def gave_up(runs: Sequence[TaskRun], lines_of: Callable[[TaskRun], list[str]]) -> Rule | None:
    """Why tasks that JAX ended in ``jax.distributed.initialize`` after its
    initialization_timeout (it aborts the process, "DEADLINE_EXCEEDED" on RegisterTask)
    waited, among ``runs``, every run of the job."""
    waiting = [r for r in runs if not r.running and _gave_up(lines_of(r))]
    if not waiting:
        return None
    return _waited(waiting, runs, (), "; JAX ended them when its initialization_timeout ran "
                   "out (\"DEADLINE_EXCEEDED\" on CoordinationService/RegisterTask)")


def _gave_up(lines: Sequence[str]) -> bool:
    text = "\n".join(lines[-60:])
    return _ABORTED in text and _REGISTER in text and "DEADLINE_EXCEEDED" in text


def _waited(waiting: Sequence[TaskRun], runs: Sequence[TaskRun],
            not_ready: Sequence[tuple[Task, str]], ended: str) -> Rule:
    processes = _processes([*(r.task for r in runs), *(t for t, _ in not_ready),
                            *(r.task for r in waiting)])
    waiting_tasks = [r.task for r in waiting]
    latest = {r.task: r for r in runs}
    absent = [t for t in processes if t not in waiting_tasks and
              (t not in latest or not latest[t].running)]
    never = {t for t, why in not_ready if why == "never launched"}

    def how(tasks: Sequence[Task]) -> str:
        one = len(tasks) == 1
        said = "was never launched" if one else "were never launched"
        if any(t not in never for t in tasks):
            said += " or ended before it connected" if one else " or ended before they connected"
        return said

    coordinator = processes[0]
    if coordinator in waiting_tasks and absent:
        return ("jax-process-missing",
                f"{coordinator} is JAX's coordinator (keras.distribution process 0 of "
                f"{len(processes)}) and waited in jax.distributed.initialize for "
                f"{_numbered(absent, processes)}, which {how(absent)}: {_GIVES_UP}{ended}",
                _LAUNCH_ALL)
    if coordinator in absent:
        return ("jax-coordinator-missing",
                f"{_names(waiting_tasks)} waited in jax.distributed.initialize to reach JAX's "
                f"coordinator, which process 0 ({coordinator}) starts on its port, and "
                f"{coordinator} {how([coordinator])}: {_GIVES_UP}{ended}",
                f"launch {coordinator} too, with the others (%worker all --bg PROGRAM)")
    return ("jax-not-connected",
            f"{_names(waiting_tasks)} waited in jax.distributed.initialize: the processes "
            f"never all connected to JAX's coordinator; {_GIVES_UP}{ended}",
            "let every process reach the same coordinator (process 0's address) with the same "
            "process count: call keras.distribution.initialize() without arguments and leave "
            "the KERAS_DISTRIBUTION_* variables mwhelpers gives each task alone, and launch "
            "every chief and worker task")


def port_taken(task: str, raised: str, traceback: Sequence[str],
               lines: Sequence[str], port: int) -> Rule | None:
    """Process 0 (``task``) could not start JAX's coordinator: ``raised`` (the exception
    that ended it, 'Type: message') with its ``traceback`` lines, its log ``lines``, the
    task's ``port``."""
    raised_it = _NO_SERVER in raised and any(_SERVICE in ln for ln in traceback)
    said = next((m for m in map(_PORT_LINE.search, lines) if m), None)
    if not raised_it and said is None:
        return None
    # JAX raises "Failed to start RPC server" after gRPC's line, or (JAX 0.10.2, about two
    # runs in three here) crashes with SIGSEGV after that line: either names the port.
    address = f"port {port}"
    if said is not None:
        port, address = int(said["port"]), f"port {said['port']} ({said['address']})"
    how = f'"{_NO_SERVER}"' if raised_it else "gRPC's \"Failed to add port to server\""
    holder = holder_of(port)
    now = f"; {holder} holds it now" if holder != "another process" else ""
    return ("jax-port-taken",
            f"{task} is process 0 of keras.distribution and could not start JAX's coordinator "
            f"on its {address}: another socket held the port when JAX tried to listen on it "
            f"({how}){now}",
            f"end whatever holds port {port} (ss -ltnp 'sport = :{port}' names it), or define "
            "the cluster again (%cluster) to get free ports, and launch again")


def fetched_split(task: str, raised: str) -> Rule | None:
    """``task`` raised (``raised``, 'Type: message') because it fetched a variable that is
    split over other processes' devices too."""
    if _SPLIT not in raised:
        return None
    return ("jax-fetch-split",
            f"{task} asked for the whole value of an array that is split over several "
            "processes' devices (a ModelParallel mesh axis that crosses processes), and JAX "
            "refuses: each process holds only its own shards.  Keras's BackupAndRestore, "
            "ModelCheckpoint, save_weights and get_weights all fetch each variable whole",
            "save with keras.callbacks.OrbaxCheckpoint(directory=...) (every process writes "
            "its own shards into one checkpoint; model.load_weights(directory) restores the "
            "newest onto the mesh in use), read a split variable with jax.experimental."
            "multihost_utils.process_allgather(v.value, tiled=True), or keep the model axis "
            "inside each process (no more devices along it than one process has)")


def orbax_relative(task: str, raised: str, lines: Sequence[str]) -> Rule | None:
    """``task`` failed after Orbax refused a relative path (in ``raised``, or said in its log
    ``lines`` before Keras failed on what Orbax returned)."""
    said = _RELATIVE.search(raised) or next(
        (m for m in map(_RELATIVE.search, reversed(lines)) if m), None)
    if said is None:
        return None
    return ("orbax-relative-path",
            f"{task} gave Orbax a relative path ({said[1]}), and Orbax takes absolute paths "
            "only: OrbaxCheckpoint's save raises this, and model.load_weights(folder) fails "
            "inside Keras on what Orbax returns instead of the checkpoint",
            "pass an absolute folder to keras.callbacks.OrbaxCheckpoint and to "
            "model.load_weights: os.path.abspath(folder)")
