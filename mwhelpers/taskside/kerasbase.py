"""What every Keras 3 mend of the worker side shares: the switch, the version, the one-line
notices, and whether a model trains under multi-worker MultiWorkerMirroredStrategy.

The mends themselves: ``kerasfix.py`` (``fit`` and ``evaluate``, keras-team/keras#20585, and
the entry point :func:`kerasfix.install`), ``kerascallbacks.py`` (BackupAndRestore and
ModelCheckpoint), ``kerasresume.py`` (BackupAndRestore resumes at the saved batch),
``kerasmixed.py`` (LossScaleOptimizer's finite check).  Each changes a Keras only in the
releases it was tested with, only where Keras's source still holds what it mends, and says in
one line when it steps aside.

This file imports only the standard library: a task loads it without the mwhelpers package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

KERAS_FIX_ENV = "MWHELPERS_KERAS_FIX"
# Arms a mend where it cannot tell whether this Keras still needs it (an untested release, or
# source it does not recognise); a Keras that shows the fix is left alone all the same.
FORCE_ENV = "MWHELPERS_KERAS_FIX_FORCE"
# The Keras releases the mends were tested with (major, minor), both ends included; others are
# left alone with a warning.
TESTED = ((3, 0), (3, 16))
PATCHED = "_mwhelpers_keras_fix"  # set on what a mend changed: changed once
SKIPPED = ("[mwhelpers] the Keras 3 multi-worker fix ({issue}) is not applied: {why}; "
           "the program runs Keras unchanged")
CANNOT_TELL = ("[mwhelpers] Keras {version}: cannot tell whether {what} ({issue}) still needs "
               "mending: {why}; not mended, Keras runs unchanged. To check, run the reproducer "
               "of {issue} in mwhelpers' repository with this Keras; to mend it anyway, set "
               + FORCE_ENV + "=1")
CARRIES = "carries the fix of"  # in every line that says Keras has a mend's fix
FIXED = ("[mwhelpers] Keras {version} " + CARRIES + " {what} ({issue}): {how}; nothing to "
         "mend, Keras runs unchanged")
FORCED = ("[mwhelpers] Keras {version}: {what} ({issue}) mended although {why}, because "
          + FORCE_ENV + "=1 says so")
_said: set[str] = set()

if TYPE_CHECKING:  # (not evaluated: this file also runs under the Python of other hosts)
    from typing import Protocol, TypeGuard

    class ReduceFn(Protocol):
        """``strategy.reduce``: (reduce_op, value, axis) -> the reduced value."""

        def __call__(self, reduce_op: object, value: object, axis: object = None) -> object: ...

    class Extended(Protocol):
        """What the mends call on ``strategy.extended`` (its other attributes, the chief's
        ``should_checkpoint`` and ``_task_id``, are read with ``getattr`` and a default)."""

        def _in_multi_worker_mode(self) -> bool: ...

    class Strategy(Protocol):
        """What the mends use of a MultiWorkerMirroredStrategy (``reduce`` is replaced on the
        instance while one Keras call runs)."""

        extended: Extended
        reduce: ReduceFn
        num_replicas_in_sync: int

        def experimental_local_results(self, value: object) -> tuple[object, ...]: ...


def say_once(key: str, line: str) -> None:
    """Print ``line`` to stderr the first time ``key`` is said in this process."""
    if key not in _said:
        _said.add(key)
        print(line, file=sys.stderr, flush=True)


def say_who_writes(key: str, callback: str, chief: bool, path: object, temp: str, verb: str,
                   note: str = "") -> None:
    """Say once (per ``key``) who writes ``path`` for a chief-aware ``callback`` under
    multi-worker MWMS: the chief there, the others (``verb``: "save", "write") to ``temp``,
    deleted after; ``note`` ends with "; " when given."""
    who = (f"this task is the chief and writes {path}; the others {verb} to {temp} and delete it"
           if chief else f"the chief writes {path}; this task {verb}s to {temp} and deletes it")
    say_once(key, f"[mwhelpers] Keras {keras_version()} {callback} under multi-worker MWMS: {who} "
                  f"(Keras 3 callbacks have no chief; {note}turn off: {KERAS_FIX_ENV}=0)")


def fix_wanted(environ: Mapping[str, str]) -> bool:
    """False when ``MWHELPERS_KERAS_FIX`` says off (0, false, no, off); on by default."""
    return environ.get(KERAS_FIX_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def forced(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``MWHELPERS_KERAS_FIX_FORCE`` says on (1, true, yes, on); off by default."""
    return environ.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def multi_worker_job(environ: Mapping[str, str] = os.environ) -> bool:
    """True when TF_CONFIG names more than one worker-like task (chief and workers)."""
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}").get("cluster", {})
        return sum(len(cluster.get(job) or ()) for job in ("chief", "worker")) > 1
    except (ValueError, AttributeError, TypeError):
        return False


def keras_version() -> str | None:
    """The version of the Keras this process imported, from the module itself.  While Keras
    is still being imported (a mend runs as soon as its module loads), ``keras`` has no
    ``__version__`` yet, and Keras 3.5 has not loaded ``keras.src.version``: it is loaded
    here then (it holds only the version)."""
    for name in ("keras.src.version", "keras"):
        version = getattr(sys.modules.get(name), "__version__", None)
        if version:
            return str(version)
    if "keras.src" in sys.modules:
        import importlib

        try:
            version = getattr(importlib.import_module("keras.src.version"), "__version__", None)
        except ImportError:
            return None
        return str(version) if version else None
    return None


def major_minor(version: str | None) -> tuple[int, ...]:
    """(3, 15) for '3.15.1', '3.15.0.dev2026', ...; () when there are no numbers."""
    return tuple(int(n) for n in re.findall(r"\d+", version or "")[:2])


def untested(version: str | None) -> str | None:
    """Why a mend leaves this Keras alone (unknown, or outside :data:`TESTED`), or None (also
    when ``MWHELPERS_KERAS_FIX_FORCE=1``: the mend then decides from the source alone)."""
    if forced():
        return None
    numbers = major_minor(version)
    if not numbers:
        return "the Keras version is unknown"
    if not TESTED[0] <= numbers <= TESTED[1]:
        low, high = (".".join(map(str, t)) for t in TESTED)
        return f"Keras {version} is outside the releases it was tested with ({low} to {high})"
    return None


def plain(text: str) -> str:
    """Source without whitespace (:func:`source_of`'s form) and without the prefixes that
    name where Keras's ops live (``ops.``, ``backend.ops.``, ``backend.ops.numpy.``, ...),
    so that ``ops.isfinite(g)`` and ``backend.ops.numpy.isfinite(g)`` read alike."""
    return re.sub(r"(?<![A-Za-z0-9_])(?:keras\.src\.|keras\.)?(?:backend\.)?ops\.(?:numpy\.)?",
                  "", text)


def source_of(function: Callable[..., object]) -> str | None:
    """``function``'s source with all whitespace taken out, or None when it cannot be read."""
    import inspect

    try:
        return "".join(inspect.getsource(function).split())
    except (OSError, TypeError):
        return None


def is_multi_worker(strategy: object) -> TypeGuard[Strategy]:
    """True for a MultiWorkerMirroredStrategy in multi-worker mode (the only case changed)."""
    tf = sys.modules.get("tensorflow")
    try:
        return (tf is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                and bool(strategy.extended._in_multi_worker_mode()))
    except AttributeError:
        return False


def worker_of(model: object) -> tuple[Strategy, bool, str] | None:
    """(strategy, chief?, temporary folder name) under multi-worker MWMS, else None."""
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or not is_multi_worker(strategy):
        return None
    extended = strategy.extended
    chief = bool(getattr(extended, "should_checkpoint", True))
    return strategy, chief, f"workertemp_{getattr(extended, '_task_id', 0)}"


def local_path(path: object) -> bool:
    """True for a path on this machine's file system (not ``gs://``, ``s3://``, ...)."""
    return "://" not in str(path)


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_empty(path: str) -> None:
    """Remove the folder ``path`` if it is empty; leave it otherwise."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def safely(patch: Callable[[ModuleType], object], issue: str,
           skipped: str = SKIPPED) -> Callable[[ModuleType], None]:
    """``patch``, run so that a Keras it does not know runs unchanged and says why once
    (``skipped``: the line, with ``{issue}`` and ``{why}``)."""
    def run(module: ModuleType) -> None:
        try:
            patch(module)
        except Exception as e:  # a Keras we do not know: run it unchanged
            say_once(f"skipped-{issue}", skipped.format(issue=issue, why=f"{type(e).__name__}: {e}"))
    run.__wrapped__ = patch  # type: ignore[attr-defined]  # after_import adds it once
    return run
