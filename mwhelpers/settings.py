"""Every ``MWHELPERS_*`` environment variable in one table, read in one place.

:data:`SETTINGS` holds the variables a user sets (each with its type, its
default and what it means) and :data:`SET_BY_MWHELPERS` the ones mwhelpers sets
in a task's environment for the task's own program to read.  Each setting is also a
typed constant (``settings.KERAS_FIX.read()`` is a ``bool``); reading one checks it: a bad
value is a
:class:`~mwhelpers.errors.UsageError` that names the variable and says what to
give.  The list in the guide, ``docs/guide/extension.md`` (its "Settings"), is
:func:`markdown` (``python -m mwhelpers.settings`` prints it; a test keeps the
page equal to it).

Two switches are also read inside workers by code that runs without this
package (:mod:`mwhelpers.taskside.tfdata` and :mod:`mwhelpers.taskside.kerasfix` are loaded by
path in a task's start-up): they read the value the kernel passed on as
:func:`switch` does here, and a test holds them to it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from .errors import UsageError
from .taskside.wire import Env

OFF_WORDS = ("0", "false", "no", "off")


def switch(text: str) -> bool:
    """On unless the text says off (``0``, ``false``, ``no``, ``off``)."""
    return text.strip().lower() not in OFF_WORDS


def seconds_or_off(text: str) -> float:
    """Seconds, at least 1; 0 means off."""
    value = float(text)
    if value < 0 or 0 < value < 1:
        raise ValueError("below 1")
    return value


def port_range_text(text: str) -> tuple[int, int]:
    """``LOW-HIGH``, both ends included, within 1024..65535."""
    low, high = (int(p) for p in text.split("-"))
    if not 1024 <= low <= high <= 65535:
        raise ValueError("out of order or outside 1024..65535")
    return low, high


def command(text: str) -> list[str]:
    """A command line, split as a shell would; not empty."""
    words = shlex.split(text)
    if not words:
        raise ValueError("empty")
    return words


def milliseconds(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("below 0")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 1024 <= value <= 65535:
        raise ValueError("outside 1024..65535")
    return value


T = TypeVar("T", covariant=True)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: ``parse`` turns its text into the value (raising
    ValueError when it cannot), ``default`` is used when it is unset or blank."""

    name: str
    parse: Callable[[str], T]
    default: T
    shown_default: str
    meaning: str
    give: str  # what to give, said when the value is bad

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """Its value in ``environ`` (default: this process's), checked."""
        text = (os.environ if environ is None else environ).get(self.name, "").strip()
        if not text:
            return self.default
        try:
            return self.parse(text)
        except ValueError:
            raise UsageError(f"{self.name}={text!r}: give {self.give}") from None


LOG_DIR: Setting[str | None] = Setting(
    "MWHELPERS_LOG_DIR", str, None, "`./worker_logs`",
    "the folder under which each kernel's task logs go (one subfolder per notebook and "
    "kernel)", "a folder")
PORT_RANGE: Setting[tuple[int, int] | None] = Setting(
    "MWHELPERS_PORT_RANGE", port_range_text, None,
    "20000 to just below the ephemeral range",
    "the ports a local cluster's tasks get (reserved across notebooks with file locks)",
    "LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, for example 20000-30000")
SSH: Setting[list[str]] = Setting(
    "MWHELPERS_SSH", command, ["ssh"], "`ssh`",
    "the ssh command of the ssh backend, for example `ssh -F my_config` (its `ssh` "
    "option wins)", "a command, for example 'ssh -F my_config'")
HEARTBEAT: Setting[float] = Setting(
    "MWHELPERS_HEARTBEAT", seconds_or_off, 10.0, "10",
    "seconds of silence after which a task on another host counts as lost and its "
    "agent ends it; 0 turns the heartbeat off (the ssh, slurm and ray backends' "
    "`heartbeat` option wins)",
    "the seconds of silence after which a remote task counts as lost (1 or more; 0 "
    "turns the heartbeat off)")
STALL_FIX: Setting[bool] = Setting(
    "MWHELPERS_STALL_FIX", switch, True, "on",
    "`0` turns off, for the kernel's launches, the end-of-fit stall fix (tf.data "
    "autotuning off in MultiWorkerMirroredStrategy workers); `--no-stall-fix` per launch",
    "1 or 0")
KERAS_FIX: Setting[bool] = Setting(
    "MWHELPERS_KERAS_FIX", switch, True, "on",
    "`0` turns off the Keras 3 multi-worker fix (keras-team/keras#20585), also an "
    "explicit `fix_keras_multi_worker()` call; `--no-keras-fix` per launch", "1 or 0")
KERAS_FIX_FORCE: Setting[bool] = Setting(
    "MWHELPERS_KERAS_FIX_FORCE", switch, False, "off",
    "`1` makes each Keras 3 mend act where it cannot tell whether this Keras needs it (an "
    "untested release, or source it does not know). A Keras that shows the fix is still left "
    "alone",
    "1 or 0")
LAZY_PYPLOT: Setting[bool] = Setting(
    "MWHELPERS_LAZY_PYPLOT", switch, True, "on",
    "`0` lets Keras import `matplotlib.pyplot` when a task imports Keras (by default "
    "the import waits until a plot needs it: about 0.4 s less CPU at every start)",
    "1 or 0")
LAZY_JAX: Setting[bool] = Setting(
    "MWHELPERS_LAZY_JAX", switch, True, "on",
    "`0` lets TensorFlow import JAX as it loads, where JAX is installed (by default JAX "
    "waits until it is used: about 3 s less CPU at every start)", "1 or 0")
ORBAX_CHECK: Setting[bool] = Setting(
    "MWHELPERS_ORBAX_CHECK", switch, True, "on",
    "`0` turns off the check of a Keras `OrbaxCheckpoint` folder in a task: a relative one, "
    "to which every save would fail, is named with the absolute folder to give", "1 or 0")
LAYOUT_CHECK: Setting[bool] = Setting(
    "MWHELPERS_LAYOUT_CHECK", switch, True, "on",
    "`0` turns off the check of a `ModelParallel` LayoutMap against the model before its "
    "first step (Keras on JAX): a rule that matches no variable, a large variable that no rule "
    "shards", "1 or 0")
WARM_START: Setting[bool] = Setting(
    "MWHELPERS_WARM_START", switch, True, "on",
    "`0` starts every local task in a fresh interpreter; by default a task whose "
    "program imports TensorFlow or Keras is forked from a process that imported "
    "TensorFlow once (less CPU per task: benchmarks/bench_warmstart.py)", "1 or 0")
WARM_HOSTS: Setting[bool] = Setting(
    "MWHELPERS_WARM_HOSTS", switch, True, "on",
    "`0` starts nothing ahead on other hosts; by default a cluster of the ssh or ray backend "
    "starts a warm server on each host and a spare agent for each task when it is defined (the "
    "slurm backend: a spare with a warm server of its own, in its own job step), so that a "
    "launch there forks like a local one (benchmarks/bench_multihost.py)",
    "1 or 0")
RECONNECT_MS: Setting[int] = Setting(
    "MWHELPERS_RECONNECT_MS", milliseconds, 50, "50",
    "gRPC's first reconnect back-off in every task (added to `TF_GRPC_DEFAULT_OPTIONS` "
    "as `grpc.initial_reconnect_backoff_ms` unless that names it): a task that dials a "
    "peer not yet up tries again after this, not after gRPC's 1 s; `0` leaves gRPC's own",
    "whole milliseconds, 0 or more")
PORT_BASE: Setting[int | None] = Setting(
    "MWHELPERS_PORT_BASE", port, None, "from the Slurm job id",
    "in a batch script from `write_sbatch`: the first of the ports its tasks use",
    "a port number between 1024 and 65535")

def host_or_off(text: str) -> str:
    """An address or host name, or a word that says off (then ``""``)."""
    text = text.strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError("empty or with spaces")
    return "" if text.lower() in OFF_WORDS else text


JAX_GLOO_HOST: Setting[str] = Setting(
    "MWHELPERS_JAX_GLOO_HOST", host_or_off, "", "the task's address",
    "where JAX's gloo collectives listen in a task (by default the address of the task that "
    "`KERAS_DISTRIBUTION_JOB_ADDRESSES` names; `0` keeps JAX's own choice, what the host name "
    "resolves to)", "an address, or 0")

SETTINGS: tuple[Setting[object], ...] = (
    LOG_DIR, PORT_RANGE, SSH, HEARTBEAT, STALL_FIX, KERAS_FIX, KERAS_FIX_FORCE, LAZY_PYPLOT,
    LAZY_JAX, LAYOUT_CHECK, ORBAX_CHECK, WARM_START, WARM_HOSTS, RECONNECT_MS, PORT_BASE, JAX_GLOO_HOST,
)

# What mwhelpers puts in a task's environment (not settings: read them, do not set them).
SET_BY_MWHELPERS: tuple[tuple[str, str], ...] = (
    (Env.TASK, "the task, for example `worker:1`"),
    (Env.ATTEMPT, "1, 2, ...: which attempt of a supervised job this is"),
    (Env.SESSION, "the kernel's mark, by which escaped processes of its tasks are found"),
    ("MWHELPERS_BG", "set in what a `%%script --bg` cell starts, so that `%killbgscripts` "
                     "finds what escaped from it"),
    (Env.GUARD_FD, "the pipe by which a local task notices that its kernel died"),
    (Env.DUMP_FD, "the pipe on which a task's start-up is asked to write every thread's "
                          "stack to its log (a stuck task, before it is ended); taken out of "
                          "the environment before the program runs"),
    (Env.ENGINE_ID, "an interactive task's engine number, which it asks ipyparallel's "
                            "controller for (`%cluster N --interactive`)"),
    (Env.STANDBY_FD, "the pipe on which a process started ahead waits until a restart "
                             "releases it (`supervise(standby=True)`)"),
    (Env.EXIT_RECORD, "where the task's start-up writes how the program ended when it "
                              "raised (the file beside its log, `mwhelpers.exitrecord`); taken "
                              "out of the environment before the program runs"),
    (Env.POD, "in a pod of a job from `write_kubernetes`: the job's shape (its name, its "
              "Service, its number of tasks, their port, how long a pod waits for the others' "
              "names), from which the pod's start-up builds `TF_CONFIG`"),
)

BY_NAME = {s.name: s for s in SETTINGS}


def markdown() -> str:
    """The settings as the guide (``docs/guide/extension.md``) lists them."""
    lines = ["| variable | default | what it does |", "|---|---|---|"]
    lines += [f"| `{s.name}` | {s.shown_default} | {s.meaning} |" for s in SETTINGS]
    lines += ["", "Set by mwhelpers in every task's environment, for its program to read:", "",
              "| variable | what it holds |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in SET_BY_MWHELPERS]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
