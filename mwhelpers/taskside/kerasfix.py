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

Keras 3's ``BackupAndRestore`` and ``ModelCheckpoint`` have no notion of a
chief: every worker writes the same files, and two workers writing one HDF5
file fail with h5py's ``unable to lock file``.  Under multi-worker MWMS, the
chief writes where the user asked and every other worker writes the same save
to ``<folder>/workertemp_<task id>/`` and deletes it right after (each worker
still saves, as saving may run collectives).  ``BackupAndRestore`` restores
what Keras 3 saves: the weights, the optimizer's state and the epoch to start
from, never a batch inside an epoch (with an integer ``save_freq`` the epoch
starts again from its first batch, with the weights of the last save).  Keras 3
writes into each backup the epoch it counted itself, from 0 in every new process,
so until a restarted epoch ends its backups would say epoch 0 and a second fault
would run the epochs from 0 again on the latest weights; here the count starts at
the epoch restored.  The
chief's backup is written beside and then moved into place file by file, weights
first: a worker killed while saving never leaves a half-written file, at worst
new weights with the previous epoch's number (that epoch is then run again).

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

import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

ISSUE = "keras-team/keras#20585"
KERAS_FIX_ENV = "MWHELPERS_KERAS_FIX"
TRAINER = "keras.src.backend.tensorflow.trainer"
BACKUP = "keras.src.callbacks.backup_and_restore"
CHECKPOINT = "keras.src.callbacks.model_checkpoint"
# The Keras releases this was tested with (major, minor), both ends included; others are left
# alone with a warning.
TESTED = ((3, 0), (3, 16))
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
_PATCHED = "_mwhelpers_keras_fix"

NOTICE = ("[mwhelpers] Keras {version}: fit and evaluate mended for multi-worker "
          "MultiWorkerMirroredStrategy (" + ISSUE + "; {what}); "
          "turn off: MWHELPERS_KERAS_FIX=0")
CALLBACK_NOTICE = ("[mwhelpers] Keras {version} {callback} under multi-worker MWMS: {who} "
                   "(Keras 3 callbacks have no chief; turn off: MWHELPERS_KERAS_FIX=0)")
CHIEF_WRITES = "this task is the chief and writes {path}; the others save to {temp} and delete it"
OTHER_WRITES = "the chief writes {path}; this task saves to {temp} and deletes it"
SKIPPED = ("[mwhelpers] the Keras 3 multi-worker fix (" + ISSUE + ") is not applied: {why}; "
           "the program runs Keras unchanged")
FIXED_UPSTREAM = ("[mwhelpers] Keras {version} does not have the failing lines of " + ISSUE
                  + " in its trainer: nothing to mend, Keras runs unchanged")
OFF = ("[mwhelpers] fix_keras_multi_worker(): not armed, " + KERAS_FIX_ENV + "=0 says off "
       "(Keras runs unchanged)")
_said: set[str] = set()
_local = threading.local()
if TYPE_CHECKING:  # (not evaluated: this file also runs under the Python of other hosts)
    from typing import Protocol, TypeGuard

    class ReduceFn(Protocol):
        """``strategy.reduce``: (reduce_op, value, axis) -> the reduced value."""

        def __call__(self, reduce_op: object, value: object, axis: object = None) -> object: ...

    class Extended(Protocol):
        """What this file calls on ``strategy.extended`` (its other attributes, the chief's
        ``should_checkpoint`` and ``_task_id``, are read with ``getattr`` and a default)."""

        def _in_multi_worker_mode(self) -> bool: ...

    class Strategy(Protocol):
        """What this file uses of a MultiWorkerMirroredStrategy (``reduce`` is replaced on the
        instance while one Keras call runs)."""

        extended: Extended
        reduce: ReduceFn

        def experimental_local_results(self, value: object) -> tuple[object, ...]: ...

    class BackupCallback(Protocol):
        """What the mended BackupAndRestore methods use of ``self`` (Keras's own attributes)."""

        model: object
        backup_dir: object
        double_checkpoint: bool
        _current_epoch: int

    class CheckpointCallback(Protocol):
        """What the mended ModelCheckpoint methods use of ``self`` (Keras's own attributes)."""

        model: object
        filepath: object

        def _get_file_path(self, *args: object, **kwargs: object) -> object: ...

    # A rewrite of one form of ``strategy.reduce``: (strategy, the real reduce, reduce_op,
    # value, axis) -> a 1-tuple holding the result, or None to leave the call to the real one.
    Rewrite = Callable[[Strategy, ReduceFn, object, object, object], tuple[object] | None]


def _say_once(key: str, line: str) -> None:
    if key not in _said:
        _said.add(key)
        print(line, file=sys.stderr, flush=True)


def fix_wanted(environ: Mapping[str, str]) -> bool:
    """False when ``MWHELPERS_KERAS_FIX`` says off (0, false, no, off); on by default."""
    return environ.get(KERAS_FIX_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def multi_worker_job(environ: Mapping[str, str] = os.environ) -> bool:
    """True when TF_CONFIG names more than one worker-like task (chief and workers)."""
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}").get("cluster", {})
        return sum(len(cluster.get(job) or ()) for job in ("chief", "worker")) > 1
    except (ValueError, AttributeError, TypeError):
        return False


def keras_version() -> str | None:
    """The version of the Keras this process imported, from the module itself."""
    for name in ("keras.src.version", "keras"):
        version = getattr(sys.modules.get(name), "__version__", None)
        if version:
            return str(version)
    return None


def major_minor(version: str | None) -> tuple[int, ...]:
    """(3, 15) for '3.15.1', '3.15.0.dev2026', ...; () when there are no numbers."""
    return tuple(int(n) for n in re.findall(r"\d+", version or "")[:2])


def _source(function: Callable[..., object]) -> str | None:
    import inspect

    try:
        return "".join(inspect.getsource(function).split())
    except (OSError, TypeError):
        return None


def _multi_worker(strategy: object) -> TypeGuard[Strategy]:
    """True for a MultiWorkerMirroredStrategy in multi-worker mode (the only case changed)."""
    tf = sys.modules.get("tensorflow")
    try:
        return (tf is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                and bool(strategy.extended._in_multi_worker_mode()))
    except AttributeError:
        return False


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
        if strategy is None or not _multi_worker(strategy):
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
        if not _multi_worker(strategy):
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


def _trainer_plan(module: ModuleType, version: str) -> tuple[tuple[str, ...] | None, str | None]:
    """What to mend in this trainer module: (('build', 'logs') subsets, None) or (None, why)."""
    numbers = major_minor(version)
    if not numbers:
        return None, "the Keras version is unknown"
    if not TESTED[0] <= numbers <= TESTED[1]:
        low, high = (".".join(map(str, t)) for t in TESTED)
        return None, f"Keras {version} is outside the releases it was tested with ({low} to {high})"
    if numbers < GRADIENTS_REDUCED_SINCE:
        return None, (f"Keras {version} never all-reduces the gradients across the workers of a "
                      "MultiWorkerMirroredStrategy (each worker would train its own copy of the "
                      "model; fixed in Keras 3.5, keras-team/keras#19969): install keras>=3.5, "
                      "or 3.10 or later for exact losses")
    cls = _trainer_class(module)
    if cls is None:
        return None, f"Keras {version}'s trainer module has no TensorFlowTrainer or Trainer class"
    build = getattr(cls, "_maybe_symbolic_build", None)
    if build is None:
        return None, f"Keras {version}'s trainer has no _maybe_symbolic_build"
    reduce_fn = getattr(module, "reduce_per_replica", None)
    if reduce_fn is None:
        return None, f"Keras {version}'s trainer has no reduce_per_replica"
    places = []
    text = _source(build)
    if text is None:
        return None, f"Keras {version}'s source cannot be read"
    if BUILD_LINE in text:
        places.append("build")
    text = _source(reduce_fn)
    if text is None:
        return None, f"Keras {version}'s source cannot be read"
    if LOGS_LINE in text:
        places.append("logs")
    return tuple(places), None


def patch_trainer(module: ModuleType) -> bool:
    """Mend ``keras.src.backend.tensorflow.trainer``; True when something was changed."""
    if getattr(module, _PATCHED, False):
        return False
    version = keras_version() or "(version unknown)"
    places, why = _trainer_plan(module, version)
    if why:
        if multi_worker_job():
            _say_once("skipped", SKIPPED.format(why=why))
        return False
    if not places:
        if multi_worker_job():
            _say_once("upstream", FIXED_UPSTREAM.format(version=version))
        setattr(module, _PATCHED, True)
        return False
    what = "; ".join({"build": "the build looks at this worker's first batch",
                      "logs": "the step's logs are averaged across replicas"}[p] for p in places)
    numbers = major_minor(version)
    what += "".join(f"; not mended: {c}" for low, high, c in CAVEATS if low <= numbers <= high)

    def announce() -> None:
        _say_once("notice", NOTICE.format(version=version, what=what))

    trainer = _trainer_class(module)
    if "build" in places and trainer is not None:  # the plan found the class
        _wrap_method(trainer, "_maybe_symbolic_build", _first_local_batch, announce)
    if "logs" in places:
        _wrap_function(module, "reduce_per_replica", _logs_mean, announce)
    setattr(module, _PATCHED, True)
    return True


# -- the callbacks ----------------------------------------------------------------------

def _worker_of(model: object) -> tuple[Strategy, bool, str] | None:
    """(strategy, chief?, temporary folder name) under multi-worker MWMS, else None."""
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or not _multi_worker(strategy):
        return None
    extended = strategy.extended
    chief = bool(getattr(extended, "should_checkpoint", True))
    return strategy, chief, f"workertemp_{getattr(extended, '_task_id', 0)}"


def _local_path(path: object) -> bool:
    return "://" not in str(path)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _remove_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _patch_backup(module: ModuleType) -> str | None:
    cls = getattr(module, "BackupAndRestore", None)
    needed = ("_save_model", "on_train_begin", "on_train_end")
    attributes = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                  "_prev_training_metadata_path")
    if cls is None or not all(callable(getattr(cls, n, None)) for n in needed):
        return f"Keras {keras_version()}'s BackupAndRestore has no {' or '.join(needed)}"
    if getattr(cls, _PATCHED, False):
        return None
    save, train_begin, train_end = cls._save_model, cls.on_train_begin, cls.on_train_end

    def paths(self: BackupCallback, folder: str) -> dict[str, str]:
        names = {a: os.path.basename(str(getattr(self, a))) for a in attributes[1:]
                 if hasattr(self, a)}
        return {"backup_dir": folder, **{a: os.path.join(folder, n) for a, n in names.items()}}

    def save_to(self: BackupCallback, where: Mapping[str, str]) -> None:
        before = {a: getattr(self, a) for a in where}
        try:
            for a, v in where.items():
                setattr(self, a, v)
            save(self)
        finally:
            for a, v in before.items():
                setattr(self, a, v)

    def _save_model(self: BackupCallback) -> object:
        worker = _worker_of(self.model)
        if worker is None or not all(hasattr(self, a) for a in attributes[:3]):
            return save(self)
        _, chief, temp_name = worker
        folder = str(self.backup_dir)
        temp = os.path.join(folder, temp_name)
        _say_once(f"backup-{folder}", CALLBACK_NOTICE.format(
            version=keras_version(), callback="BackupAndRestore",
            who=(CHIEF_WRITES if chief else OTHER_WRITES).format(
                path=folder, temp=os.path.join(folder, "workertemp_<id>") if chief else temp)))
        if not chief:
            save_to(self, paths(self, temp))
            _remove_tree(temp)
            return None
        if not _local_path(folder):
            return save(self)
        # The chief's backup: written beside, then moved into place file by file.
        staging = os.path.join(folder, ".mwhelpers-saving")
        os.makedirs(folder, exist_ok=True)
        if getattr(self, "double_checkpoint", False):
            for a in ("_weights_path", "_training_metadata_path"):
                if os.path.exists(getattr(self, a)):
                    shutil.copyfile(getattr(self, a), getattr(self, a) + ".bkp")
        double, self.double_checkpoint = getattr(self, "double_checkpoint", False), False
        try:
            save_to(self, paths(self, staging))
        finally:
            self.double_checkpoint = double
        for a in ("_weights_path", "_training_metadata_path"):
            os.replace(os.path.join(staging, os.path.basename(getattr(self, a))), getattr(self, a))
        _remove_tree(staging)
        return None

    def on_train_begin(self: BackupCallback, logs: object = None) -> object:
        result = train_begin(self, logs)
        restored = getattr(self.model, "_initial_epoch", None)
        # Keras counts finished epochs from 0 in every process and saves that count: start it
        # at the epoch restored, so that the restarted epoch's backups say where they are.
        if _worker_of(self.model) is not None and restored and hasattr(self, "_current_epoch"):
            self._current_epoch = restored
        return result

    def on_train_end(self: BackupCallback, logs: object = None) -> object:
        worker = _worker_of(self.model)
        if worker is None:
            return train_end(self, logs)
        _, chief, temp_name = worker
        folder = str(self.backup_dir)
        if not getattr(self, "delete_checkpoint", True) or not _local_path(folder):
            return train_end(self, logs) if chief else None
        # Each removes what it wrote; the folder goes once it is empty, whoever is last.
        if chief:
            for a in attributes[1:]:
                if hasattr(self, a) and os.path.exists(str(getattr(self, a))):
                    os.remove(str(getattr(self, a)))
            _remove_tree(os.path.join(folder, ".mwhelpers-saving"))
        else:
            _remove_tree(os.path.join(folder, temp_name))
        _remove_empty(folder)
        return None

    for f, original in ((_save_model, save), (on_train_begin, train_begin),
                        (on_train_end, train_end)):
        f.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(cls, f.__name__, f)
    setattr(cls, _PATCHED, True)
    return None


def _patch_checkpoint(module: ModuleType) -> str | None:
    cls = getattr(module, "ModelCheckpoint", None)
    needed = ("_save_model", "_get_file_path")
    if cls is None or not all(callable(getattr(cls, n, None)) for n in needed):
        return f"Keras {keras_version()}'s ModelCheckpoint has no {' or '.join(needed)}"
    if getattr(cls, _PATCHED, False):
        return None
    save, file_path = cls._save_model, cls._get_file_path

    def _get_file_path(self: CheckpointCallback, *args: object, **kwargs: object) -> object:
        path = file_path(self, *args, **kwargs)
        worker = _worker_of(self.model)
        if worker is None:
            return path
        folder, name = os.path.split(str(path))
        temp = os.path.join(folder, worker[2] if not worker[1] else "workertemp_<id>", name)
        _say_once(f"checkpoint-{self.filepath}", CALLBACK_NOTICE.format(
            version=keras_version(), callback="ModelCheckpoint",
            who=(CHIEF_WRITES if worker[1] else OTHER_WRITES).format(path=path, temp=temp)))
        return path if worker[1] else temp

    def _save_model(self: CheckpointCallback, *args: object, **kwargs: object) -> object:
        worker = _worker_of(self.model)
        if worker is not None:
            # Keras creates a missing folder after checking that it is missing; the others'
            # temporary folders are inside the chief's, so two workers can create it at once and
            # one fails with FileExistsError. Each makes its own folder first, whoever is first.
            own = os.path.dirname(str(self._get_file_path(*args, **kwargs)))
            if own and _local_path(own):
                os.makedirs(own, exist_ok=True)
        result = save(self, *args, **kwargs)
        if worker is not None and not worker[1]:
            folder = os.path.dirname(str(file_path(self, *args, **kwargs)))
            _remove_tree(os.path.join(folder, worker[2]))
        return result

    for f, original in ((_save_model, save), (_get_file_path, file_path)):
        f.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(cls, f.__name__, f)
    setattr(cls, _PATCHED, True)
    return None


def patch_callbacks(module: ModuleType) -> None:
    """Make BackupAndRestore or ModelCheckpoint (whichever ``module`` defines) chief-aware."""
    patch = _patch_backup if module.__name__ == BACKUP else _patch_checkpoint
    why = patch(module)
    if why and multi_worker_job():
        _say_once(f"skipped-{module.__name__}", SKIPPED.format(why=why))


def _safely(patch: Callable[[ModuleType], object]) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        try:
            patch(module)
        except Exception as e:  # a Keras we do not know: run it unchanged
            _say_once("skipped", SKIPPED.format(why=f"{type(e).__name__}: {e}"))
    return run


def install(after_import: Callable[[str, Callable[[ModuleType], object]], None]) -> None:
    """Mend Keras as soon as it loads its trainer and callbacks (now, where it already has);
    ``after_import(name, callback)`` is :func:`tfdata.after_import`."""
    after_import(TRAINER, _safely(patch_trainer))
    after_import(BACKUP, _safely(patch_callbacks))
    after_import(CHECKPOINT, _safely(patch_callbacks))


def fix_keras_multi_worker() -> bool:
    """Make Keras 3 ``fit``/``evaluate`` work under multi-worker MultiWorkerMirroredStrategy
    in this process (keras-team/keras#20585), and its BackupAndRestore and ModelCheckpoint
    chief-aware, for programs that mwhelpers did not start.

    Call it anywhere before the first ``fit`` (before or after importing Keras). Calling it
    again is harmless. Only a MultiWorkerMirroredStrategy in multi-worker mode behaves
    differently; a Keras outside the tested releases, or with other internals, is left
    unchanged and the first multi-worker use says why in one line (also when the installed
    Keras has fixed the bug upstream). Returns True once the fix is armed, False when
    ``MWHELPERS_KERAS_FIX=0`` (or ``%%worker --no-keras-fix``) says off, which it then says
    in one line.
    """
    from .tfdata import after_import

    if not fix_wanted(os.environ):
        _say_once("off", OFF)
        return False

    install(after_import)
    return True
