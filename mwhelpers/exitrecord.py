"""How a task's program ended, as the task itself wrote it down: the kernel's reading.

Every task's start-up (:mod:`mwhelpers.taskside._bootstrap`) writes a small JSON file when
the program ends by an exception that makes its exit code other than 0, at the path the
kernel gives it in ``MWHELPERS_EXIT_RECORD``: :func:`path_for` the task's log, beside it.  A
task on another host writes it there, and its agent sends it back, to the same place.

The failure's kind and reason (:mod:`mwhelpers.failures`), the diagnosis and the timeline's
exit read it first; the log's text is read for what a record cannot say: a task killed by a
signal (SIGKILL, a C++ abort) writes none, nor does a program that ``os._exit`` ends, or one
that mwhelpers did not start.

Public: :class:`ExitRecord` (``read``, ``summary``, ``name``), :func:`path_for`,
:data:`EXIT_RECORD_ENV`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# Where a task's start-up writes its record: named in its environment.  The start-up
# (taskside/_bootstrap.py, which imports nothing) spells it out again; a test holds them equal.
EXIT_RECORD_ENV = "MWHELPERS_EXIT_RECORD"

__all__ = ["EXIT_RECORD_ENV", "ExitRecord", "path_for"]


def path_for(log_path: str | os.PathLike[str]) -> Path:
    """Where the record of the task logging to ``log_path`` is: ``worker-0.log`` ->
    ``worker-0.exit.json`` (a log not named ``*.log`` gets ``.exit.json`` added)."""
    log = Path(log_path)
    stem = log.stem if log.suffix == ".log" else log.name
    return log.with_name(f"{stem}.exit.json")


@dataclass(frozen=True)
class ExitRecord:
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

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ExitRecord | None:
        """The record at ``path``; None when there is none or it is not one (never raises)."""
        try:
            data = json.loads(Path(path).read_text())
            record = cls(type=data["type"], message=data["message"],
                         traceback=data["traceback"], time=float(data["time"]),
                         pid=int(data["pid"]), exit_code=int(data["exit_code"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if not all(isinstance(v, str) for v in (record.type, record.message, record.traceback)):
            return None
        return record

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
