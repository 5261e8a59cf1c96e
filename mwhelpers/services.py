"""What one runtime owns and lends to what it starts, closed with it.

Three things outlive a single launch but belong to one runtime:

* the :class:`~mwhelpers.follow.Follower`, the thread that reads every run's log while it
  runs (each :class:`~mwhelpers.taskrun.TaskRun` is followed by its runtime's);
* the cell limits (:class:`~mwhelpers.watcher.CellLimits`), how much of a task's output a
  cell shows (``rt.cell_limits``);
* the warm-start servers (:class:`~mwhelpers.warmstart.WarmStarter`, one per interpreter
  and bootstrap), which the runtime's local launchers fork their tasks from, so that a new
  cluster (``%cluster`` again) forks from the server the last one used.

Two runtimes in one process share none of them, and :meth:`Services.close` (called by
``Runtime.close``) ends them: the follower reads each log to its end and stops, and the
warm-start servers end (their tasks are the launchers' to end, before).
"""

from __future__ import annotations

import threading

from .follow import Follower
from .warmstart import WarmStarter
from .watcher import CellLimits


class Services:
    """A runtime's follower, cell limits and warm-start servers (see the module's text)."""

    def __init__(self) -> None:
        self.follower = Follower()
        self.cell_limits = CellLimits()
        self._warm: dict[tuple[str, str], WarmStarter] = {}
        self._lock = threading.Lock()
        self.closed = False

    def warm_starter(self, python: str, bootstrap: str) -> WarmStarter:
        """The warm starter of tasks started by ``python`` running ``bootstrap``, made on
        first use; every local launcher of this runtime gets the same one."""
        with self._lock:
            if self.closed:
                raise RuntimeError("this runtime was closed; create a new Runtime")
            starter = self._warm.get((python, bootstrap))
            if starter is None:
                starter = self._warm[(python, bootstrap)] = WarmStarter(python, bootstrap)
            return starter

    @property
    def warm_pids(self) -> list[int]:
        """The pids of the warm-start servers that run now."""
        with self._lock:
            starters = list(self._warm.values())
        return [pid for starter in starters for pid in starter.pids]

    def close(self) -> None:
        """End the warm-start servers and stop following (each log read to its end)."""
        with self._lock:
            self.closed = True
            starters, self._warm = list(self._warm.values()), {}
        for starter in starters:
            starter.close()
        self.follower.close()
