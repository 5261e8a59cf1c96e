"""How a task's program ended, as the task itself wrote it down: the kernel's reading.

Every task's start-up (:mod:`mwhelpers.taskside._bootstrap`) writes a small JSON file when
the program ends by an exception that makes its exit code other than 0, at the path the
kernel gives it in ``MWHELPERS_EXIT_RECORD``: :func:`path_for` the task's log, beside it.  A
task on another host writes it there, and its agent sends it back, to the same place.

The failure's kind and reason (:mod:`mwhelpers.failures`), the diagnosis and the timeline's
exit read it first; the log's text is read for what a record cannot say: a task killed by a
signal (SIGKILL, a C++ abort) writes none, nor does a program that ``os._exit`` ends, or one
that mwhelpers did not start.

Public: :class:`ExitRecord` (``read``, ``summary``, ``name``: declared in
:mod:`mwhelpers.taskside.wire` for the writer and the reader), :func:`path_for`,
:data:`EXIT_RECORD_ENV`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .taskside.wire import Env, ExitRecord

# Where a task's start-up writes its record: named in its environment (taskside/wire.py
# declares it, and the record, for both sides).
EXIT_RECORD_ENV = Env.EXIT_RECORD

__all__ = ["EXIT_RECORD_ENV", "ExitRecord", "path_for"]


def path_for(log_path: str | os.PathLike[str]) -> Path:
    """Where the record of the task logging to ``log_path`` is: ``worker-0.log`` ->
    ``worker-0.exit.json`` (a log not named ``*.log`` gets ``.exit.json`` added)."""
    log = Path(log_path)
    stem = log.stem if log.suffix == ".log" else log.name
    return log.with_name(f"{stem}.exit.json")
