"""The launch options, one table: ``Runtime.launch``'s keywords, ``LaunchRequest``'s
fields, ``supervise``'s and the ``%%worker`` flags all come from :data:`LAUNCH_OPTIONS`.

A module of its own, importing nothing of the package, so that ``%load_ext
mwhelpers`` can describe the options in ``%%worker?`` without loading the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

__all__ = ["LAUNCH_OPTIONS", "LaunchOption", "LaunchOptions", "ReadyMode", "TaskOptions",
           "launch_help", "launch_usage"]

# When a background task counts as ready: ``auto`` (``port`` for servers, else ``start``),
# once its port accepts connections, or once it has started.
ReadyMode = Literal["auto", "port", "start"]


class TaskOptions(TypedDict, total=False):
    """The launch options every way of starting tasks takes (``supervise`` too), typed:
    ``timeout``, ``env``, ``stall_fix`` and ``keras_fix`` (each described in
    :data:`LAUNCH_OPTIONS`)."""

    timeout: float | str | None
    env: Mapping[str, str] | Sequence[str] | None
    stall_fix: bool | None
    keras_fix: bool | None


class LaunchOptions(TaskOptions, total=False):
    """The launch options as keywords, typed: what :meth:`Runtime.launch
    <mwhelpers.workers.Runtime.launch>` and ``launch_all`` take as ``**options`` (each
    described in :data:`LAUNCH_OPTIONS`)."""

    background: bool
    log: str | os.PathLike[str] | None
    ready: ReadyMode
    verbose: bool | None


@dataclass(frozen=True)
class LaunchOption:
    """A launch option: the keyword of :meth:`Runtime.launch <mwhelpers.workers.Runtime.launch>`
    and :class:`LaunchRequest` (``name``), the magics' flag for it, its value's name
    (``metavar``; None: a switch that sets ``value``), whether it repeats, and what it does."""

    name: str
    flag: str
    metavar: str | None
    help: str
    value: object = True
    repeat: bool = False

    def usage(self) -> str:
        words = self.flag + (f" {self.metavar}" if self.metavar else "")
        return f"[{words}{' ...' if self.repeat else ''}]"


# The launch options, declared once: LaunchRequest.parse checks them, %%worker and %worker
# parse their flags from this table and say their usage with it.
LAUNCH_OPTIONS = (
    LaunchOption("background", "--bg", None, "return once the task is ready (its port accepts "
           "connections) and follow it with a live view; its output goes to its log"),
    LaunchOption("timeout", "--timeout", "S", "seconds: to finish in the foreground, to be ready "
           "with --bg"),
    LaunchOption("log", "--log", "PATH", "the log file (default: TASK.log in the log folder)"),
    LaunchOption("ready", "--ready", "port|start", "when a --bg task counts as ready: its port "
           "accepts connections (auto for servers) or it has started"),
    LaunchOption("env", "--env", "K=V", "variables for the task, on top of the kernel's",
           repeat=True),
    LaunchOption("stall_fix", "--no-stall-fix", None, "keep tf.data autotuning in MWMS workers "
           "(see mwhelpers.taskside.tfdata)", value=False),
    LaunchOption("keras_fix", "--no-keras-fix", None, "run Keras 3 unmended: no mend of fit, "
           "evaluate and the callbacks under MWMS, nor of optimizer.iterations under a "
           "ParameterServerStrategy (see mwhelpers.taskside.kerasfix)", value=False),
    LaunchOption("verbose", "--verbose", None, "stream every line, TensorFlow's informational "
           "C++ lines too"),
)


def launch_usage() -> str:
    """The launch options as a usage line: ``[--bg] [--timeout S] ...``."""
    return " ".join(o.usage() for o in LAUNCH_OPTIONS)


def launch_help() -> str:
    """One line per launch option: its flag and what it does."""
    flags = [o.flag + (f" {o.metavar}" if o.metavar else "") for o in LAUNCH_OPTIONS]
    width = max(map(len, flags))
    return "\n".join(f"  {f:<{width}}  {o.help}" for f, o in zip(flags, LAUNCH_OPTIONS, strict=True))
