"""Exceptions raised by mwhelpers (:class:`~mwhelpers.failures.WorkerFailed`, which carries
failure records, is raised from :mod:`mwhelpers.failures`).

Every error says what was wrong and what to do about it.  The worker errors
render as a short report in IPython (``_render_traceback_``) instead of a
traceback through mwhelpers' own frames: the interesting part is the worker's
log, not our call stack.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .taskname import Task


class MWHelpersError(Exception):
    """Base class of every error mwhelpers raises."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through mwhelpers' frames.
        return [f"{type(self).__name__}: {self}"]


class UsageError(MWHelpersError, ValueError):
    """Bad input (a task name, an option, a signal...). Nothing was changed."""


class InfrastructureError(MWHelpersError, RuntimeError):
    """A machine, a connection or an allocation failed, not the input: a host that does
    not answer or refuses the login, no Python or no working folder there, no Slurm
    allocation, ``ssh`` or ``srun`` missing here.  Nothing was changed; fixing the
    infrastructure and running the same call again is what to do."""


class WorkerError(MWHelpersError, RuntimeError):
    """A worker task failed or had to be ended."""


class WorkerTimeout(WorkerError):
    """A task did not become ready, or did not finish, within its timeout.

    ``not_ready`` names the tasks that never became ready; ``diagnosis`` is
    what the report explains (dicts with ``key``, ``cause`` and ``advice``), when recognised.
    """

    def __init__(self, message: str, not_ready: Iterable[Task] = (),
                 diagnosis: Iterable[dict[str, str]] = ()) -> None:
        super().__init__(message)
        self.not_ready = list(not_ready)
        self.diagnosis = list(diagnosis)


class CellFailed(WorkerError):
    """A cell run on interactive tasks raised on some of them, or some had to be ended.

    ``errors``: ``{task: "ExceptionName: message"}`` of the tasks that raised; ``dead``: the
    tasks that died during (or before) the cell; ``stuck``: those that were still running it
    when the others had failed, or when its timeout or Ctrl-C came.
    """

    def __init__(self, message: str, errors: dict[Task, str] | None = None,
                 dead: Iterable[Task] = (), stuck: Iterable[Task] = ()) -> None:
        super().__init__(message)
        self.errors = dict(errors or {})
        self.dead = list(dead)
        self.stuck = list(stuck)
