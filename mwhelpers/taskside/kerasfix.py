"""Keras 3 ``fit`` and ``evaluate`` under multi-worker MultiWorkerMirroredStrategy.

Keras 3.3 and later (``tf.keras`` since TensorFlow 2.16) fail to train with
MultiWorkerMirroredStrategy when two or more worker processes take part:
keras-team/keras#20585.  (Keras 3.0 to 3.2 do not fail, but each worker trains
its own copy of the model; before 3.5 this is left alone, see below.)  Two
places in Keras's TensorFlow trainer (``keras/src/backend/tensorflow/trainer.py``)
cause it, and both must be mended for training to work:

1. ``TensorFlowTrainer._maybe_symbolic_build`` (Keras 3.5 and later) asks the
   strategy to reduce one whole input batch, ``strategy.reduce("MEAN", (x, y),
   axis=None)``, only to learn its shapes.  In multi-worker mode every batch is
   a ``PerReplica`` value and MultiWorkerMirroredStrategy cannot reduce a
   nested structure: ``ValueError: Attempt to convert a value (PerReplica...)``.
   Here the first local replica's batch is taken instead
   (``strategy.experimental_local_results(v)[0]``): same shapes, same dtypes,
   and no collective at all.
2. ``reduce_per_replica`` (Keras 3.3 and later) reduces the step's logs in
   multi-worker mode with ``strategy.reduce("MEAN", v, axis=0)``; the logs are
   scalars, so that fails with ``Invalid reduction dimension 0 for input with
   0 dimensions``.  Here that call is made with ``axis=None`` (the mean across
   replicas, as Keras does in one process; tf_keras too reduces these logs with
   ``axis=None``).

The checkpointing callbacks are mended beside this file (``kerascallbacks.py``);
:func:`install` arms every mend of the worker side.

Everything else runs Keras's own code: each replacement checks that the
strategy is a MultiWorkerMirroredStrategy in multi-worker mode and otherwise
calls the original.  Each place is changed only while Keras's source still
holds the line that fails; a Keras that has fixed it upstream is left alone.
Where the internals are not the ones this was written against, nothing is
changed and the log says why in one line.

Workers started by mwhelpers get this without calling anything (their
start-up, ``_bootstrap.py``, arms it); ``MWHELPERS_KERAS_FIX=0``,
``%%worker --no-keras-fix`` or ``rt.defaults.keras_fix = False`` turn it off.
Other programs call :func:`fix_keras_multi_worker` before their first ``fit``;
``MWHELPERS_KERAS_FIX=0`` turns that call off too.

This file imports only the standard library at module level, so the worker
start-up can load it by path without the mwhelpers package.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from . import kerascallbacks, kerasmixed, keraspss, kerasresume, kerastensorboard
from .kerasbase import (
    CANNOT_TELL,
    CARRIES,
    FORCED,
    KERAS_FIX_ENV,
    PATCHED,
    SKIPPED,
    fix_wanted,
    forced,
    is_multi_worker,
    keras_version,
    major_minor,
    multi_worker_job,
    safely,
    say_once,
    source_of,
    untested,
)

ISSUE = "keras-team/keras#20585"
TRAINER = "keras.src.backend.tensorflow.trainer"
# Before 3.5 Keras all-reduces the gradients (3.2.1 to 3.4) inside a merge_call, where nothing
# is reduced, or not at all (3.0 to 3.2.0): each worker trains alone (keras-team/keras#19969). Mending
# fit there would turn a failure into silently wrong training; left alone, said why.
GRADIENTS_REDUCED_SINCE = (3, 5)
# Upstream faults of multi-worker training that this does not mend, said with the notice.
CAVEATS = (
    ((3, 5), (3, 7), "Keras 3.5 to 3.7 add the workers' gradients without scaling the loss, so "
                     "each step is as large as N single-process steps (keras-team/keras#20609, "
                     "fixed in 3.8)"),
    ((3, 8), (3, 9), "Keras 3.8 and 3.9 log a loss and metrics that differ from one process's "
                     "(the weights do not; 3.10 logs them right)"),
)
# The failing lines, whitespace removed, as Keras 3.3 to 3.15 write them.
BUILD_LINE = "data_batch=self.distribute_strategy.reduce("
LOGS_LINE = 'strategy.reduce("MEAN",v,axis=0)'

NOTICE = ("[mwhelpers] Keras {version}: fit and evaluate mended for multi-worker "
          "MultiWorkerMirroredStrategy (" + ISSUE + "; {what}); "
          "turn off: MWHELPERS_KERAS_FIX=0")
FIXED_UPSTREAM = ("[mwhelpers] Keras {version} " + CARRIES + " fit and evaluate (" + ISSUE
                  + "): its trainer takes a local replica's batch for the build and averages "
                  "the logs without an axis; nothing to mend, Keras runs unchanged")
OFF = ("[mwhelpers] fix_keras_multi_worker(): not armed, " + KERAS_FIX_ENV + "=0 says off "
       "(Keras runs unchanged)")
_local = threading.local()
if TYPE_CHECKING:  # (not evaluated: this file also runs under the Python of other hosts)
    from .kerasbase import ReduceFn, Strategy

    # A rewrite of one form of ``strategy.reduce``: (strategy, the real reduce, reduce_op,
    # value, axis) -> a 1-tuple holding the result, or None to leave the call to the real one.
    Rewrite = Callable[[Strategy, ReduceFn, object, object, object], tuple[object] | None]


# -- the trainer ------------------------------------------------------------------------

class _Reduce:
    """Stands in for ``strategy.reduce`` on one strategy while one Keras call runs (on this
    thread), rewriting only the failing form of the call; all others go to the strategy."""

    def __init__(self, strategy: Strategy, rewrite: Rewrite) -> None:
        self.strategy = strategy
        self.real = strategy.reduce
        self.rewrite = rewrite

    def __call__(self, reduce_op: object, value: object, axis: object = None) -> object:
        if getattr(_local, "active", None) is self:
            rewritten = self.rewrite(self.strategy, self.real, reduce_op, value, axis)
            if rewritten is not None:
                return rewritten[0]
        return self.real(reduce_op, value, axis=axis)

    def __enter__(self) -> _Reduce:
        self.outer: _Reduce | None = getattr(_local, "active", None)
        _local.active = self
        self.had = "reduce" in vars(self.strategy)
        self.strategy.reduce = self
        return self

    def __exit__(self, *exc: object) -> None:
        if self.had:
            self.strategy.reduce = self.real
        else:
            del self.strategy.reduce
        _local.active = self.outer


def _distributed(value: object) -> bool:
    tf = sys.modules["tensorflow"]
    return isinstance(value, tf.distribute.DistributedValues)


def _first_local_batch(strategy: Strategy, real: ReduceFn, reduce_op: object, value: object,
                       axis: object) -> tuple[object] | None:
    """Bug 1: a batch reduced only for its shapes: each element's first local replica."""
    tf = sys.modules["tensorflow"]
    flat = tf.nest.flatten(value)
    if axis is not None or not flat or not all(map(_distributed, flat)):
        return None
    return (tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], value),)


def _logs_mean(strategy: Strategy, real: ReduceFn, reduce_op: object, value: object,
               axis: object) -> tuple[object] | None:
    """Bug 2: the scalar logs' mean over axis 0: the mean across replicas instead."""
    if axis != 0 or str(getattr(reduce_op, "value", reduce_op)).upper() != "MEAN":
        return None
    return (real(reduce_op, value, axis=None),)


def _wrap_method(cls: type, name: str, rewrite: Rewrite, announce: Callable[[], None]) -> None:
    original = getattr(cls, name)

    def method(self: object, *args: object, **kwargs: object) -> object:
        strategy = getattr(self, "_distribute_strategy", None)
        if strategy is None or not is_multi_worker(strategy):
            return original(self, *args, **kwargs)
        announce()
        with _Reduce(strategy, rewrite):
            return original(self, *args, **kwargs)

    method.__name__ = name
    method.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, method)


def _wrap_function(module: ModuleType, name: str, rewrite: Rewrite,
                   announce: Callable[[], None]) -> None:
    original = getattr(module, name)

    def function(values: object, strategy: object, reduction: object, *args: object,
                 **kwargs: object) -> object:
        if not is_multi_worker(strategy):
            return original(values, strategy, reduction, *args, **kwargs)
        announce()
        with _Reduce(strategy, rewrite):
            return original(values, strategy, reduction, *args, **kwargs)

    function.__name__ = name
    function.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, name, function)


def _trainer_class(module: ModuleType) -> type | None:
    """Keras's TensorFlow trainer: TensorFlowTrainer (3.0 to 3.15), Trainer (3.16 nightlies)."""
    for name in ("TensorFlowTrainer", "Trainer"):
        cls = getattr(module, name, None)
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            return cls
    return None


# What Keras does once it has fixed them (ours, docs/keras-20585/trainer.patch, or the like):
# the build takes a local replica's batch, the logs' mean has no axis.
BUILD_FIXED = ("experimental_local_results",)
LOGS_FIXED = ('strategy.reduce("MEAN",v,axis=None)', 'strategy.reduce("MEAN",v)')


def _trainer_plan(module: ModuleType, version: str
                  ) -> tuple[tuple[str, ...] | None, str | None, tuple[str, ...]]:
    """What to do with this trainer module: (places to mend, None, places it cannot judge),
    with the places ``("build", "logs")``; or (None, why it is left alone, ())."""
    why = untested(version)
    if why:
        return None, why, ()
    numbers = major_minor(version)
    if numbers and numbers < GRADIENTS_REDUCED_SINCE:
        return None, (f"Keras {version} never all-reduces the gradients across the workers of a "
                      "MultiWorkerMirroredStrategy (each worker would train its own copy of the "
                      "model; fixed in Keras 3.5, keras-team/keras#19969): install keras>=3.5, "
                      "or 3.10 or later for exact losses"), ()
    cls = _trainer_class(module)
    if cls is None:
        return None, f"Keras {version}'s trainer module has no TensorFlowTrainer or Trainer class", ()
    build = getattr(cls, "_maybe_symbolic_build", None)
    if build is None:
        return None, f"Keras {version}'s trainer has no _maybe_symbolic_build", ()
    reduce_fn = getattr(module, "reduce_per_replica", None)
    if reduce_fn is None:
        return None, f"Keras {version}'s trainer has no reduce_per_replica", ()
    places: list[str] = []
    unknown: list[str] = []
    for place, function, failing, fixed in (("build", build, BUILD_LINE, BUILD_FIXED),
                                            ("logs", reduce_fn, LOGS_LINE, LOGS_FIXED)):
        text = source_of(function)
        if text is None:
            return None, f"Keras {version}'s source cannot be read", ()
        if failing in text:
            places.append(place)
        elif not any(f in text for f in fixed):
            unknown.append(place)  # neither the failing line nor the fix: cannot tell
    return tuple(places), None, tuple(unknown)


def patch_trainer(module: ModuleType) -> bool:
    """Mend ``keras.src.backend.tensorflow.trainer``; True when something was changed."""
    if getattr(module, PATCHED, False):
        return False
    version = keras_version() or "(version unknown)"
    places, why, unknown = _trainer_plan(module, version)
    if why or places is None:
        if multi_worker_job():
            say_once("skipped", SKIPPED.format(issue=ISSUE, why=why))
        return False
    named = {"build": "_maybe_symbolic_build", "logs": "reduce_per_replica"}
    if unknown:
        doubt = (f"its {' and '.join(named[p] for p in unknown)} holds neither the failing "
                 "line nor the fix this knows")
        if forced():
            say_once("forced", FORCED.format(version=version, what="fit and evaluate",
                                             issue=ISSUE, why=doubt))
            places = places + unknown  # the rewrites act only on the failing call forms
        elif multi_worker_job():
            say_once("cannot-tell", CANNOT_TELL.format(version=version, what="fit and evaluate",
                                                       issue=ISSUE, why=doubt))
    if not places:
        if multi_worker_job() and not unknown:
            say_once("upstream", FIXED_UPSTREAM.format(version=version))
        setattr(module, PATCHED, True)
        return False
    what = "; ".join({"build": "the build looks at this worker's first batch",
                      "logs": "the step's logs are averaged across replicas"}[p] for p in places)
    numbers = major_minor(version)
    what += "".join(f"; not mended: {c}" for low, high, c in CAVEATS if low <= numbers <= high)

    def announce() -> None:
        say_once("notice", NOTICE.format(version=version, what=what))

    trainer = _trainer_class(module)
    if "build" in places and trainer is not None:  # the plan found the class
        _wrap_method(trainer, "_maybe_symbolic_build", _first_local_batch, announce)
    if "logs" in places:
        _wrap_function(module, "reduce_per_replica", _logs_mean, announce)
    setattr(module, PATCHED, True)
    return True


def install(after_import: Callable[[str, Callable[[ModuleType], object]], None]) -> None:
    """Mend Keras as soon as it loads its trainer and callbacks (now, where it already has);
    ``after_import(name, callback)`` is :func:`tfdata.after_import`."""
    after_import(TRAINER, safely(patch_trainer, ISSUE))
    after_import(kerasresume.EPOCH_ITERATOR,
                 safely(kerasresume.patch_epoch_iterator, kerasresume.ISSUE))
    after_import(TRAINER, safely(kerasresume.patch_epoch_iterator, kerasresume.ISSUE))
    after_import(kerascallbacks.BACKUP, safely(kerascallbacks.patch_callbacks, ISSUE))
    after_import(kerascallbacks.CHECKPOINT, safely(kerascallbacks.patch_callbacks, ISSUE))
    after_import(kerasmixed.TARGET, safely(kerasmixed.patch, kerasmixed.ISSUE))
    after_import(keraspss.TARGET, safely(keraspss.patch, keraspss.ISSUE))
    after_import(kerastensorboard.TARGET, safely(kerastensorboard.patch, kerastensorboard.ISSUE))


def fix_keras_multi_worker() -> bool:
    """Arm mwhelpers' mends of Keras 3 in this process, for programs that mwhelpers did not
    start (its tasks get them at start-up).  Call it anywhere before the first ``fit`` (before
    or after importing Keras); calling it again is harmless.

    What each changes, and where:

    * ``fit``/``evaluate`` (keras-team/keras#20585), ``BackupAndRestore``/``ModelCheckpoint``
      and ``TensorBoard`` made chief-aware: only under a MultiWorkerMirroredStrategy in
      multi-worker mode;
    * ``BackupAndRestore(save_freq=N)`` resuming at the backup's batch
      (docs/keras-backup-resume.md): in any process, on a backup that this mend wrote;
    * ``LossScaleOptimizer``'s finite check decided by all replicas (docs/keras-lossscale.md):
      under any strategy with more than one replica in sync, MirroredStrategy in one process
      included;
    * ``optimizer.iterations`` counted atomically (docs/keras-pss-iterations.md): an optimizer
      whose counter lives under a ParameterServerStrategy.

    Each acts only on the Keras releases it was tested with and only where Keras's source
    still holds what it mends; where Keras carries the fix it steps aside, and where it cannot
    tell it does nothing; each says so in one line (``MWHELPERS_KERAS_FIX_FORCE=1`` mends where
    it cannot tell).  Returns True once armed, False when ``MWHELPERS_KERAS_FIX=0`` (or
    ``%%worker --no-keras-fix``) says off, which it then says in one line.
    """
    from .tfdata import after_import

    if not fix_wanted(os.environ):
        say_once("off", OFF)
        return False

    install(after_import)
    return True
